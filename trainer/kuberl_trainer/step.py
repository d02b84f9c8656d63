"""One optimizer step on a shard of the global batch, normalised so every world size trains the same.

FSDP averages gradients over ranks, so each rank's loss is its share of the *global* token-mean (summed
per-token losses over the global number of loss tokens) times the world size. A step whose loss or
gradient norm is not finite is skipped (gradients dropped) and reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kuberl_trainer.algorithms.losses import LossConfig, policy_loss
from kuberl_trainer.distributed import all_reduce_sum


@dataclass
class TokenBatch:
    """This rank's part of a training batch; all [B, T] and aligned (index t describes token t)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1, with 0 at t = 0, shape [B, T]."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    picked = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def train_step(model, optimizer, batch: TokenBatch, loss_config: LossConfig, max_grad_norm: float,
               world_size: int) -> dict[str, float]:  # fmt: skip
    """Forward, backward, clip, step; returns loss, grad norm, mismatch KL and whether it was skipped."""
    global_tokens = all_reduce_sum(float(batch.loss_mask.sum()))
    logprobs = token_logprobs(model, batch.input_ids, batch.attention_mask)
    local_tokens = float(batch.loss_mask.sum())
    loss, stats = policy_loss(logprobs, logprobs.detach(), batch.rollout_logprobs, batch.advantages,
                              batch.loss_mask, loss_config)  # fmt: skip
    # policy_loss normalised by this rank's tokens; re-normalise to the global token count
    share = loss * (local_tokens / max(global_tokens, 1.0)) * world_size
    optimizer.zero_grad(set_to_none=True)
    report = {"loss": all_reduce_sum(float(share.detach()) / world_size), "skipped": 0.0, **stats}
    if not math.isfinite(report["loss"]):
        report.update(skipped=1.0, grad_norm=float("nan"))
        return report
    share.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    report["grad_norm"] = norm
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        report["skipped"] = 1.0
        return report
    optimizer.step()
    return report
