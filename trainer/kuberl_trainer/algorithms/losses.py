"""The policy loss: clipped surrogate with rollout-mismatch correction, optional KL and entropy terms.

`logprobs` are the learner's (with gradient); `old_logprobs` the learner's at the start of the batch
(the proximal policy of the clip); `rollout_logprobs` what the rollout engine sampled with. Their gap
is corrected by truncated (tis) or masked (mis) importance sampling and reported as the mismatch KL.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kuberl.api.spec import LossAggregation, OffPolicyMode


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.28
    off_policy: OffPolicyMode = OffPolicyMode.TIS
    cap: float = 2.0
    aggregation: LossAggregation = LossAggregation.TOKEN_MEAN
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    temperature: float = 1.0
    """The rollout engine's sampling temperature: the learner's log-probs are of the same tempered distribution,
    or every token's importance weight would carry the gap between the two (spec.rollout.temperature)."""


@dataclass(frozen=True)
class Denominators:
    """What the loss and its diagnostics divide by, counted over a whole batch: the loss of any part of its rows
    (a micro-batch) divided by them is that part's share of the whole batch's loss, so the parts add up."""

    loss: float
    """token-mean: the batch's loss tokens; seq-mean: its trajectories with a loss token."""
    tokens: float
    """The batch's loss tokens (the diagnostics are token means)."""


def denominators(
    mask: torch.Tensor, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, config: LossConfig
) -> Denominators:
    """The denominators of a batch whose loss `mask`, old and rollout log-probs are these (all [B, T])."""
    m = kept_mask(mask.bool(), old_logprobs, rollout_logprobs, config).to(old_logprobs.dtype)
    tokens = max(float(m.sum()), 1.0)
    if config.aggregation == "token-mean":
        return Denominators(tokens, tokens)
    return Denominators(max(float((m.sum(dim=1) > 0).sum()), 1.0), tokens)


def kept_mask(
    mask: torch.Tensor, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, config: LossConfig
) -> torch.Tensor:
    """The loss mask less, with masked importance sampling (mis), the tokens whose weight is off the cap."""
    if config.off_policy != "mis":
        return mask
    weight = torch.exp(old_logprobs - rollout_logprobs).detach()
    return mask & (weight <= config.cap) & (weight >= 1 / config.cap)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: LossAggregation | str, denominator: float | None = None
) -> torch.Tensor:
    """token-mean: over every masked token of the batch; seq-mean: per trajectory first, then over them. With
    `denominator` (`Denominators.loss` of a batch these rows are part of) the sum this part adds to its mean."""
    m = mask.to(per_token.dtype)
    if how == "token-mean":
        return (per_token * m).sum() / (m.sum().clamp(min=1) if denominator is None else denominator)
    if how == "seq-mean":
        per_seq = (per_token * m).sum(dim=1) / m.sum(dim=1).clamp(min=1)
        if denominator is not None:
            return per_seq.sum() / denominator
        return per_seq[m.sum(dim=1) > 0].mean() if (m.sum(dim=1) > 0).any() else per_token.sum() * 0
    raise ValueError(f"unknown loss aggregation {how!r}: token-mean or seq-mean")


def k3(logp: torch.Tensor, logq: torch.Tensor) -> torch.Tensor:
    """Per-token estimator of KL(p || q) from samples of p: exp(q - p) - 1 - (q - p) >= 0."""
    d = logq - logp
    return torch.exp(d) - 1 - d


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: LossConfig,
    entropy: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    totals: Denominators | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss to minimise and its diagnostics. All tensors [B, T]; `mask` marks generated tokens. With
    `totals` (of a batch these rows are part of) loss and diagnostics are this part's shares of the batch's."""
    mask = mask.bool()
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.maximum(-advantages * ratio, -advantages * clipped)
    weight = torch.exp(old_logprobs - rollout_logprobs).detach()
    if config.off_policy == "tis":
        weight = weight.clamp(max=config.cap)
    elif config.off_policy == "mis":
        kept = (weight <= config.cap) & (weight >= 1 / config.cap)
        mask, weight = mask & kept, torch.ones_like(weight)
    elif config.off_policy == "none":
        weight = torch.ones_like(weight)
    else:
        raise ValueError(f"unknown off-policy correction {config.off_policy!r}: none, tis or mis")
    per_token = weight * surrogate
    if ref_logprobs is not None and config.kl_coef:
        per_token = per_token + config.kl_coef * k3(logprobs, ref_logprobs)
    if entropy is not None and config.entropy_coef:
        per_token = per_token - config.entropy_coef * entropy
    loss = aggregate(per_token, mask, config.aggregation, None if totals is None else totals.loss)
    with torch.no_grad():
        m = mask.to(logprobs.dtype)
        count = m.sum().clamp(min=1) if totals is None else totals.tokens
        stats = {
            "mismatch_kl": float((k3(old_logprobs, rollout_logprobs) * m).sum() / count),
            "clip_fraction": float(((ratio != clipped).to(m.dtype) * m).sum() / count),
            "is_weight_mean": float((weight * m).sum() / count),
        }
    return loss, stats
