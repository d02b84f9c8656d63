"""A consolidated safetensors export of the (sharded) policy: what rollout servers load or receive."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch.distributed as dist


def export_policy(model, source_model_dir: str | Path, target: str | Path, rank: int = 0) -> Path | None:
    """Gather the full state dict (every rank must call this) and, on rank 0, write a Hugging Face folder:
    `model.safetensors`, the config and the tokenizer of `source_model_dir`. Returns the folder on rank 0."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options) if dist.is_initialized() else model.state_dict()
    if rank != 0:
        return None
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)  # tied: safetensors refuses shared storage, HF re-ties on load
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    for item in Path(source_model_dir).iterdir():
        if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json" and item.is_file():
            shutil.copy2(item, target / item.name)
    return target


def policy_blob(model) -> bytes:
    """The full policy as one safetensors blob (Hugging Face names), for a rollout server's weight upload."""
    from safetensors.torch import save
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options) if dist.is_initialized() else model.state_dict()
    tensors = {name: t.detach().to("cpu").contiguous() for name, t in state.items()}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    return save(tensors)
