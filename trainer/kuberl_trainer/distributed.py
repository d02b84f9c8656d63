"""torch.distributed set-up: gloo on CPU, NCCL on GPU, the same code either way (launched by torchrun)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def init_distributed() -> tuple[int, int, torch.device]:
    """(rank, world size, device); initialises the process group when launched by torchrun."""
    if "RANK" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    if torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return rank, dist.get_world_size(), device


def all_reduce_sums(values: list[float]) -> list[float]:
    """Elementwise sums of `values` over ranks, in one collective (themselves when not distributed)."""
    if not dist.is_initialized():
        return list(values)
    # NCCL reduces only tensors on the GPU; gloo only on the CPU
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def broadcast_object(value, src: int = 0):
    """`value` from rank `src` on every rank (itself when not distributed); any picklable object."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]
