"""Methods mixed into every vLLM worker (`worker_extension_cls`): in-place weight loading.

Runs in vLLM's worker process. Tensors cannot cross `collective_rpc` intact on CPU, so weights travel as
safetensors blobs (bytes, one per bucket) and are decoded here.
"""

from __future__ import annotations


class WeightUpdateExtension:
    def load_weights_blobs(self, blobs: list[bytes]) -> int:
        """Load Hugging Face-named tensors from safetensors blobs (the buckets of one update) in place; returns
        how many. This is the only place the bytes are decoded."""
        from safetensors.torch import load

        tensors = [item for blob in blobs for item in load(blob).items()]
        self.reload_weights(weights_iterator=tensors, is_checkpoint_format=True)  # type: ignore[attr-defined]
        return len(tensors)

    def load_weights_folder(self, path: str) -> None:
        """Load every safetensors file of a Hugging Face folder in place."""
        self.reload_weights(weights_path=path, is_checkpoint_format=True)  # type: ignore[attr-defined]
