"""A consolidated safetensors export of the (sharded) policy: what rollout servers load or receive."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from kuberl_trainer.value_head import is_value_head_weight


def served_tensors(model) -> dict[str, torch.Tensor]:
    """The full policy on CPU under Hugging Face names, as served (every rank must call this when sharded).
    The value head is left out, and a tied lm_head too (safetensors refuses shared storage; HF re-ties)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options) if dist.is_initialized() else model.state_dict()
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in state.items() if not is_value_head_weight(n)}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    return tensors


def export_policy(model, source_model_dir: str | Path, target: str | Path, rank: int = 0) -> Path | None:
    """Gather the full state dict (every rank must call this) and, on rank 0, write a Hugging Face folder:
    `model.safetensors`, the config and the tokenizer of `source_model_dir`. Returns the folder on rank 0."""
    from safetensors.torch import save_file

    tensors = served_tensors(model)
    if rank != 0:
        return None
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    for item in Path(source_model_dir).iterdir():
        if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json" and item.is_file():
            shutil.copy2(item, target / item.name)
    return target


BUCKET_BYTES = 512 * 2**20
"""Largest bucket of a weight upload: a server holds one request body of at most this (plus one tensor larger
than it, alone in its bucket) while the next arrives."""


def policy_buckets(model, bucket_bytes: int = BUCKET_BYTES) -> list[bytes]:
    """The full policy as safetensors blobs of about `bucket_bytes` each (Hugging Face names, in state-dict
    order), the buckets of a rollout server's weight upload."""
    from safetensors.torch import save

    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in served_tensors(model).items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    return [save(group) for group in groups]
