"""Run under torchrun by test_micro_batches.py: three steps of a fixed ragged global batch, sharded over the
ranks, in micro-batches of at most BUDGET tokens (0: one micro-batch), with mini-batches and a reference.

    torchrun --standalone --nproc_per_node 2 tests/trainer/fsdp_micro_batch_run.py MODEL_DIR OUT.json BUDGET
"""

from __future__ import annotations

import json
import sys

import torch

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, train_step

# rank 0 takes rows 0, 2, 4, 6 (short: several share a micro-batch), rank 1 rows 1, 3, 5, 7 (long: one each)
LENGTHS = (10, 40, 12, 38, 9, 36, 11, 40)


def global_batch(vocab: int) -> TokenBatch:
    g = torch.Generator().manual_seed(11)
    rows, width = len(LENGTHS), max(LENGTHS)
    ids = torch.randint(5, vocab, (rows, width), generator=g)
    attention = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for r, n in enumerate(LENGTHS):
        attention[r, :n], mask[r, n // 3 : n] = 1, True
    advantages = torch.linspace(-1, 1, rows)[:, None].expand(rows, width).clone()
    return TokenBatch(ids, attention, mask, torch.full((rows, width), -7.0), advantages)


def main(model_dir: str, out: str, budget: str) -> None:
    rank, world, device = init_distributed()
    torch.manual_seed(0)
    model = load_policy(model_dir, FsdpSpec(activation_checkpointing=True), device)
    reference = load_policy(model_dir, FsdpSpec(activation_checkpointing=False), device, trainable=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    shard = global_batch(model.config.vocab_size).rows(torch.arange(rank, len(LENGTHS), world)).to(device)
    config = LossConfig(off_policy="tis", kl_coef=0.05, entropy_coef=0.01)
    tokens = int(budget) or None
    losses = [
        train_step(model, optimizer, shard, config, 1.0, world, 2, reference, micro_batch_tokens=tokens).loss
        for _ in range(3)
    ]
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": world, "losses": losses}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
