"""A small learner run for the resume test (launched by torchrun): a fixed batch per step, checkpoints
every N steps into a store, and a fault hook that makes one step's upload slow and says so."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.checkpoints.store import CheckpointStore
from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, train_step


def batch_for(step: int, vocab: int) -> TokenBatch:
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(5, vocab, (4, 40), generator=g)
    mask = torch.zeros(4, 40, dtype=torch.bool)
    mask[:, 12:] = True
    advantages = torch.randn(4, generator=g)[:, None].expand(4, 40).clone()
    return TokenBatch(ids, torch.ones_like(ids), mask, torch.full((4, 40), -7.0), advantages)


class SlowStepStore(CheckpointStore):
    """Uploads of one step announce themselves in a marker file and then crawl (to be killed mid-way)."""

    def __init__(self, uri: str, endpoint: str | None, slow_step: int, marker: Path) -> None:
        super().__init__(uri, endpoint_url=endpoint)
        self.slow_step, self.marker = slow_step, marker

    def upload(self, step, folder):
        if step == self.slow_step:
            put = self.backend.put

            def slow_put(key, local):
                put(key, local)
                self.marker.write_text(key)
                time.sleep(30)

            self.backend.put = slow_put  # type: ignore[method-assign]
        return super().upload(step, folder)


def main(model_dir: str, uri: str, steps: int, every: int, out: str) -> None:
    rank, world, device = init_distributed()
    torch.manual_seed(0)
    model = load_policy(model_dir, FsdpSpec(activation_checkpointing=False), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    slow = int(os.environ.get("SLOW_STEP", "-1"))
    store = SlowStepStore(uri, os.environ.get("S3_ENDPOINT"), slow, Path(out + ".uploading"))
    # STAGING: a folder of this "machine" (the multi-machine test gives each torchrun its own)
    checkpointer = Checkpointer(store, Path(os.environ.get("STAGING", out + ".staging")), keep=3, rank=rank)
    state = checkpointer.restore(model, optimizer)
    start = state.step if state else 0
    for step in range(start, steps):
        report = train_step(
            model,
            optimizer,
            batch_for(step, model.config.vocab_size),
            LossConfig(),
            1.0,
            world,
            before_update=checkpointer.ready_for_update,
        )
        if rank == 0:
            with open(out, "a") as f:
                f.write(json.dumps({"step": step + 1, "loss": report.loss, "resumed_from": start}) + "\n")
        if (step + 1) % every == 0:
            checkpointer.save(model, optimizer, TrainingState(step=step + 1, policy_version=step + 1))
    checkpointer.wait()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
