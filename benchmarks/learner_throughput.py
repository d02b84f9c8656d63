"""Learner throughput under torchrun: tokens/s of full RL train steps on random tokens.

    torchrun --standalone --nproc_per_node N benchmarks/learner_throughput.py MODEL OUT.json [BATCH] [LENGTH] [STEPS]

BATCH is the global batch (split over ranks); the first step is a warm-up and is not timed.
"""

from __future__ import annotations

import json
import sys
import time

import torch

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, train_step


def main(model_dir: str, out: str, batch: int = 8, length: int = 256, steps: int = 4) -> None:
    rank, world, device = init_distributed()
    torch.manual_seed(rank)
    model = load_policy(model_dir, FsdpSpec(activation_checkpointing=False), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    local = batch // world
    ids = torch.randint(5, model.config.vocab_size, (local, length), device=device)
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, : length // 4] = False
    shard = TokenBatch(
        ids,
        torch.ones_like(ids),
        mask,
        torch.full(ids.shape, -5.0, device=device),
        torch.randn(local, 1, device=device).expand(local, length).clone(),
    )
    train_step(model, optimizer, shard, LossConfig(), 1.0, world)  # warm-up
    started = time.monotonic()
    for _ in range(steps):
        train_step(model, optimizer, shard, LossConfig(), 1.0, world)
    elapsed = time.monotonic() - started
    if rank == 0:
        report = {
            "world_size": world,
            "global_batch": batch,
            "length": length,
            "steps": steps,
            "seconds_per_step": round(elapsed / steps, 4),
            "tokens_per_s": round(batch * length * steps / elapsed, 1),
        }
        with open(out, "w") as f:
            json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *(int(a) for a in sys.argv[3:6]))
