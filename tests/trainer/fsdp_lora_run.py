"""Run under torchrun by test_lora_fsdp.py: three steps of the fixed global batch of
tests/helpers/fsdp_equivalence.py with LoRA adapters, sharded over the ranks, with the policy's own base as the
KL reference and micro-batches; a checkpoint after the first step is restored into fresh adapters, which train
the last two steps again. Rank 0 writes the losses, the kl_ref of the last step, the resumed losses and the
sent adapters.

    torchrun --standalone --nproc_per_node 2 tests/trainer/fsdp_lora_run.py MODEL_DIR OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from helpers.fsdp_equivalence import GLOBAL_BATCH, global_batch
from safetensors.torch import load, save_file

from kuberl.api.spec import FsdpSpec, LoraSpec
from kuberl_trainer.adapters import trainable_parameters
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.checkpoints.store import CheckpointStore
from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
from kuberl_trainer.distributed import init_distributed
from kuberl_trainer.export import policy_buckets
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import train_step


def policy(model_dir: str, device: torch.device, seed: int):
    torch.manual_seed(seed)  # lora_A's random initialisation
    model = load_policy(model_dir, FsdpSpec(activation_checkpointing=True), device, lora=LoraSpec(rank=4, alpha=8))
    return model, torch.optim.AdamW(trainable_parameters(model), lr=1e-2)


def main(model_dir: str, out_dir: str) -> None:
    rank, world, device = init_distributed()
    out = Path(out_dir)
    model, optimizer = policy(model_dir, device, 0)
    rows = slice(rank * GLOBAL_BATCH // world, (rank + 1) * GLOBAL_BATCH // world)
    shard = global_batch(model.config.vocab_size).rows(rows).to(device)
    config = LossConfig(off_policy="tis", kl_coef=0.1)

    def step(model, optimizer, budget=None):
        return train_step(model, optimizer, shard, config, 1.0, world, ref_model=model, micro_batch_tokens=budget)

    reports = [step(model, optimizer, 48)]
    store = CheckpointStore(str(out / f"checkpoints{world}"))
    checkpointer = Checkpointer(store, out / f"staging{world}", keep=2, rank=rank)
    checkpointer.save(model, optimizer, TrainingState(step=1, policy_version=1))
    checkpointer.wait()
    reports += [step(model, optimizer) for _ in range(2)]
    sent = {}
    for bucket in policy_buckets(model):  # every rank gathers
        sent.update(load(bucket))
    fresh, fresh_optimizer = policy(model_dir, device, 99)
    Checkpointer(store, out / f"restore{world}", keep=2, rank=rank).restore(fresh, fresh_optimizer)
    resumed = [step(fresh, fresh_optimizer).loss for _ in range(2)]
    if rank == 0:
        save_file(sent, out / f"adapters{world}.safetensors")
        losses = [r.loss for r in reports]
        result = {"losses": losses, "kl_ref": reports[-1].kl_ref, "resumed": resumed}
        (out / f"world{world}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
