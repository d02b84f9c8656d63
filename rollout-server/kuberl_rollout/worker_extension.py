"""Methods mixed into every vLLM worker (`worker_extension_cls`): in-place weight loading.

Runs in vLLM's worker process. Weights arrive as paths of staged safetensors files (one per bucket, in
shared memory on the same machine): bytes sent through `collective_rpc` would be serialised and copied
through the engine's message queue, which took 70 % of an update.
"""

from __future__ import annotations


class WeightUpdateExtension:
    def load_weights_files(self, paths: list[str]) -> int:
        """Load Hugging Face-named tensors from safetensors files (the buckets of one update) in place, one
        tensor at a time straight from the mapped file; returns how many. The only place the bytes are decoded."""
        from safetensors import safe_open

        loaded = 0

        def tensors():
            nonlocal loaded
            for path in paths:
                with safe_open(path, framework="pt") as f:
                    for name in f.keys():  # noqa: SIM118 (safe_open is not a dict)
                        loaded += 1
                        yield name, f.get_tensor(name)

        self.reload_weights(weights_iterator=tensors(), is_checkpoint_format=True)  # type: ignore[attr-defined]
        return loaded
