"""Methods mixed into every vLLM worker (`worker_extension_cls`): in-place weight loading.

Runs in vLLM's worker process. Tensors cannot cross `collective_rpc` intact on CPU, so weights travel as
one safetensors blob (bytes) and are decoded here.
"""

from __future__ import annotations


class WeightUpdateExtension:
    def load_weights_blob(self, blob: bytes) -> int:
        """Load Hugging Face-named tensors from a safetensors blob in place; returns how many."""
        from safetensors.torch import load

        tensors = load(blob)
        self.reload_weights(weights_iterator=list(tensors.items()), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(tensors)

    def load_weights_folder(self, path: str) -> None:
        """Load every safetensors file of a Hugging Face folder in place."""
        self.reload_weights(weights_path=path, is_checkpoint_format=True)  # type: ignore[attr-defined]
