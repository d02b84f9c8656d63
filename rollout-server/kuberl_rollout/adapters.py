"""Policy versions as LoRA adapters on one frozen base model (spec.model.lora): each version is a PEFT folder
and a vLLM `LoRARequest` of its own, never merged into the base weights.

A request keeps the adapter it started with, so every token it samples is exactly that version's. An old
version is unloaded (and its folder deleted) once the newest `keep` versions are newer and no request uses it:
what is registered stays bounded however long the job runs. Version 0 is the base model itself (PEFT starts
lora_B at zero): it has no adapter.
"""

from __future__ import annotations

import json
import shutil
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config_json

MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ranks vLLM's `max_lora_rank` accepts."""


def lora_engine_arguments(lora: LoraSpec, max_staleness: int) -> dict[str, Any]:
    """vLLM's LoRA arguments for a job: the smallest allowed `max_lora_rank` that holds `lora.rank`, and room
    for every version a request may still use (maxStaleness + 1 kept, one more arriving)."""
    rank = next((r for r in MAX_LORA_RANKS if r >= lora.rank), None)
    if rank is None:
        raise ValueError(f"spec.model.lora.rank {lora.rank} is above vLLM's largest max_lora_rank {MAX_LORA_RANKS[-1]}")
    slots = max_staleness + 2
    return {"enable_lora": True, "max_lora_rank": rank, "max_loras": slots, "max_cpu_loras": slots}


@dataclass
class Adapter:
    """One policy version's adapter; `users` counts the requests sampling with it now."""

    version: int
    lora_id: int
    folder: Path | None
    """The PEFT folder vLLM loads it from; None for version 0 (the base model)."""
    users: int = 0

    @property
    def request(self):
        """The `LoRARequest` a generate call passes (None: the base model)."""
        from vllm.lora.request import LoRARequest

        if self.folder is None:
            return None
        return LoRARequest(f"policy-v{self.version}", self.lora_id, str(self.folder))


class AdapterSet:
    """The adapters one engine serves: the newest is current, at least `keep` are kept registered."""

    def __init__(self, lora: LoraSpec, base_model: str, keep: int, root: Path) -> None:
        self.config = adapter_config_json(lora, base_model)
        self.keep, self.root = keep, root
        self.adapters: dict[int, Adapter] = {0: Adapter(0, 0, None)}
        self.current = self.adapters[0]
        self._next_id = 1  # vLLM wants ids > 0, unique per adapter it ever held
        weakref.finalize(self, shutil.rmtree, root, True)

    def write(self, version: int, files: list[Path]) -> Adapter:
        """A PEFT folder for `version` from the checked tensors in `files` (the buckets of one update); the
        adapter is neither registered nor current yet."""
        from safetensors.torch import load_file, save_file

        tensors: dict = {}
        for file in files:
            tensors.update(load_file(file))
        folder = self.root / f"policy-v{version}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        save_file(tensors, folder / ADAPTER_WEIGHTS)
        (folder / ADAPTER_CONFIG).write_text(json.dumps(self.config))
        adapter = Adapter(version, self._next_id, folder)
        self._next_id += 1
        return adapter

    def publish(self, adapter: Adapter) -> None:
        """Make a registered adapter the one new requests use."""
        self.adapters[adapter.version] = adapter
        self.current = adapter

    @contextmanager
    def use(self) -> Iterator[Adapter]:
        """The current adapter, counted as in use for the duration."""
        adapter = self.current
        adapter.users += 1
        try:
            yield adapter
        finally:
            adapter.users -= 1

    def retire(self) -> list[Adapter]:
        """Take out the adapters no longer needed: older than the newest `keep`, used by no request. The caller
        unloads each from the engine, then `delete`s it."""
        kept = sorted(self.adapters)[-self.keep :]
        gone = [a for v, a in self.adapters.items() if v not in kept and a.users == 0 and a.folder is not None]
        for adapter in gone:
            del self.adapters[adapter.version]
        return gone

    @staticmethod
    def delete(adapter: Adapter) -> None:
        if adapter.folder is not None:
            shutil.rmtree(adapter.folder, ignore_errors=True)

    @property
    def registered(self) -> list[int]:
        """The versions with an adapter registered (version 0 has none)."""
        return sorted(v for v, a in self.adapters.items() if a.folder is not None)
