"""Self-check run under torchrun: a few steps of a fixed global batch, sharded over the ranks.

    torchrun --standalone --nproc_per_node 2 tests/helpers/fsdp_equivalence.py MODEL_DIR OUT.json [EXPORT_DIR]

Rank 0 writes the loss of every step; any world size must write the same numbers
(tests/trainer/test_fsdp.py compares 1 and 2 processes).
"""

from __future__ import annotations

import json
import sys

import torch

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.export import export_policy
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, train_step

GLOBAL_BATCH, LENGTH, STEPS = 4, 48, 3


def global_batch(vocab: int) -> TokenBatch:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (GLOBAL_BATCH, LENGTH), generator=g)
    loss_mask = torch.zeros(GLOBAL_BATCH, LENGTH, dtype=torch.bool)
    loss_mask[:, 16:] = True
    loss_mask[1, 40:] = False  # uneven sequence lengths: the global token-mean must still match
    return TokenBatch(
        ids,
        torch.ones_like(ids),
        loss_mask,
        torch.full((GLOBAL_BATCH, LENGTH), -7.0),
        torch.linspace(-1, 1, GLOBAL_BATCH)[:, None].expand(GLOBAL_BATCH, LENGTH).clone(),
    )


def main(model_dir: str, out: str, export_dir: str | None = None) -> None:
    rank, world, device = init_distributed()
    torch.manual_seed(0)
    model = load_policy(model_dir, FsdpSpec(activation_checkpointing=False), device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    full = global_batch(model.config.vocab_size)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    shard = full.rows(rows).to(device)
    losses = [train_step(model, optimizer, shard, LossConfig(off_policy="tis"), 1.0, world).loss for _ in range(STEPS)]
    if export_dir:
        export_policy(model, model_dir, export_dir, rank)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"world_size": world, "losses": losses}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
