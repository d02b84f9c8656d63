"""One training step on a shard of the global batch, normalised so every world size trains the same.

FSDP averages gradients over ranks, so each rank's loss is its share of the *global* token-mean (summed
per-token losses over the global number of loss tokens) times the world size. The batch may be split
into mini-batches (one optimizer update each, PPO-style, against the log-probs the policy had at the
start of the batch). An update whose loss or gradient norm is not finite is skipped (gradients dropped)
and reported.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch

from kuberl_trainer.algorithms.losses import LossConfig, policy_loss
from kuberl_trainer.distributed import all_reduce_sums
from kuberl_trainer.value_head import VALUE_HEAD, has_value_head


@dataclass
class TokenBatch:
    """This rank's part of a training batch; all [B, T] and aligned (index t describes token t)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    """Value targets (PPO): returns[b, t] is the target of V(tokens <= t) where value_mask is set."""
    value_mask: torch.Tensor | None = None

    def rows(self, index: torch.Tensor | slice) -> TokenBatch:
        return TokenBatch(
            **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[index] for f in fields(self)}
        )

    def to(self, device: torch.device) -> TokenBatch:
        return TokenBatch(
            **{
                f.name: None if getattr(self, f.name) is None else getattr(self, f.name).to(device)
                for f in fields(self)
            }
        )


@dataclass
class Forward:
    logprobs: torch.Tensor  # [B, T], log p(token t | tokens < t), 0 at t = 0
    entropy: torch.Tensor  # [B, T], entropy of the distribution token t was drawn from, 0 at t = 0
    values: torch.Tensor | None  # [B, T], V(tokens <= t), when the model has a value head


def forward(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    entropy_grad: bool = False,
    temperature: float = 1.0,
    from_position: int = 1,
) -> Forward:
    """Token log-probs, entropies and (with a value head) values, aligned with the input tokens. Log-probs
    are of the distribution the rollout engine sampled from: the logits divided by its `temperature`.

    Log-probs and entropies are computed for tokens `from_position` onwards and are 0 before: the [B, T, V]
    logits are the largest tensor of a step, and an agent's first prompt (the task, the tools), which no
    loss reads, is most of T (`first_scored`)."""
    values_wanted = has_value_head(model)
    if _right_padded(attention_mask):
        # causal attention never lets a token see the padding after it, and without a mask the attention
        # kernel takes its causal fast path (measured: a warm-up step about 20 % faster on CPU)
        attention_mask = None
    width = input_ids.shape[1]
    from_position = min(max(from_position, 1), width)
    # logits of positions from_position - 1 .. T - 1; the last predicts no input token
    kept = width - from_position + 1
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=values_wanted, logits_to_keep=kept
    )
    logits = out.logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    picked = log_probs.gather(-1, input_ids[:, from_position:, None])[..., 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        source = log_probs if entropy_grad else log_probs.detach()
        entropy = -(source.exp() * source).sum(-1)
    before = picked.new_zeros((picked.shape[0], from_position))
    values = None
    if values_wanted:
        values = getattr(model, VALUE_HEAD)(out.hidden_states[-1]).squeeze(-1).float()
    return Forward(torch.cat([before, picked], dim=1), torch.cat([before, entropy], dim=1), values)


def first_scored(loss_mask: torch.Tensor) -> int:
    """The first position any row's loss reads (1 when none does): where `forward` has to start."""
    columns = loss_mask.any(dim=0).nonzero()
    return max(int(columns[0]), 1) if len(columns) else 1


def _right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row is ones, then zeros (never a zero before a one)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1, with 0 at t = 0, shape [B, T]."""
    return forward(model, input_ids, attention_mask).logprobs


@torch.no_grad()
def predict(model, batch: TokenBatch, temperature: float = 1.0, from_position: int = 1) -> Forward:
    """A forward pass without gradient (old log-probs, values for GAE, the reference policy)."""
    return forward(model, batch.input_ids, batch.attention_mask, temperature=temperature, from_position=from_position)


STAT_KEYS = ("mismatch_kl", "clip_fraction", "is_weight_mean", "entropy", "kl_ref", "value_loss")


@dataclass(frozen=True)
class StepReport:
    """What one training step did, token-weighted over ranks and mini-batches (the metrics line's numbers)."""

    loss: float
    grad_norm: float
    """Mean over the updates that were applied (NaN when none was)."""
    skipped: float
    """Updates skipped for a non-finite loss or gradient norm."""
    tokens: float
    """Loss tokens of the global batch."""
    mismatch_kl: float = 0.0
    """KL between the rollout engine's sampling log-probs and the learner's (state mismatch)."""
    clip_fraction: float = 0.0
    is_weight_mean: float = 0.0
    entropy: float = 0.0
    kl_ref: float = 0.0
    value_loss: float = 0.0


def train_step(
    model,
    optimizer,
    batch: TokenBatch,
    loss_config: LossConfig,
    max_grad_norm: float,
    world_size: int,
    mini_batches: int = 1,
    ref_model=None,
    value_coef: float = 0.0,
    before_update: Callable[[], None] | None = None,
) -> StepReport:
    """Forward, backward, clip, step (per mini-batch); returns loss, grad norm, diagnostics (token-weighted
    over ranks and mini-batches) and the number of skipped updates. Every rank must have the same number
    of rows, at least `mini_batches` (pad with rows whose loss mask is empty). `before_update` runs before
    each optimizer step (a checkpoint still copying the weights waits there, not before the forward)."""
    temperature, start = loss_config.temperature, first_scored(batch.loss_mask)
    old = predict(model, batch, temperature, start).logprobs if mini_batches > 1 else None
    ref = None
    if ref_model is not None and loss_config.kl_coef:
        ref = predict(ref_model, batch, temperature, start).logprobs
    report: dict[str, float] = {"loss": 0.0, "skipped": 0.0, "grad_norm": 0.0, **dict.fromkeys(STAT_KEYS, 0.0)}
    total_tokens = 0.0
    norms = []
    for part in torch.tensor_split(torch.arange(batch.input_ids.shape[0]), mini_batches):
        mini = batch.rows(part)
        old_part, ref_part = (None if x is None else x[part] for x in (old, ref))
        result = _update(
            model,
            optimizer,
            mini,
            loss_config,
            max_grad_norm,
            world_size,
            old_part,
            ref_part,
            value_coef,
            before_update,
            start,
        )
        tokens = result.pop("tokens")
        total_tokens += tokens
        report["skipped"] += result.pop("skipped")
        norm = result.pop("grad_norm")
        if math.isfinite(norm):
            norms.append(norm)
        for key, value in result.items():
            report[key] = report.get(key, 0.0) + value * tokens
    report = {k: (v / max(total_tokens, 1.0) if k in ("loss", *STAT_KEYS) else v) for k, v in report.items()}
    report["grad_norm"] = sum(norms) / len(norms) if norms else float("nan")
    report["tokens"] = total_tokens
    return StepReport(**report)


def _update(
    model,
    optimizer,
    batch: TokenBatch,
    config: LossConfig,
    max_grad_norm: float,
    world_size: int,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    value_coef: float,
    before_update: Callable[[], None] | None,
    from_position: int,
) -> dict[str, float]:
    # every forward of a step starts at the same position: old, reference and new log-probs share their zeros
    local_tokens = float(batch.loss_mask.sum())
    local_values = float(batch.value_mask.sum()) if batch.value_mask is not None else 0.0
    global_tokens, global_values = all_reduce_sums([local_tokens, local_values])
    result = forward(
        model,
        batch.input_ids,
        batch.attention_mask,
        entropy_grad=config.entropy_coef > 0,
        temperature=config.temperature,
        from_position=from_position,
    )
    logprobs = result.logprobs
    loss, stats = policy_loss(
        logprobs,
        logprobs.detach() if old_logprobs is None else old_logprobs,
        batch.rollout_logprobs,
        batch.advantages,
        batch.loss_mask,
        config,
        entropy=result.entropy,
        ref_logprobs=ref_logprobs,
    )
    # policy_loss normalised by this rank's tokens; re-normalise to the global token count
    share = loss * (local_tokens / max(global_tokens, 1.0)) * world_size
    mask = batch.loss_mask.to(logprobs.dtype)
    stats["entropy"] = float((result.entropy.detach() * mask).sum() / max(local_tokens, 1.0))
    if ref_logprobs is not None:
        kl = torch.exp(ref_logprobs - logprobs.detach()) - 1 - (ref_logprobs - logprobs.detach())
        stats["kl_ref"] = float((kl * mask).sum() / max(local_tokens, 1.0))
    if result.values is not None and batch.returns is not None and value_coef:
        vmask = batch.value_mask.to(result.values.dtype)
        squared = ((result.values - batch.returns) ** 2 * vmask).sum()
        share = share + value_coef * 0.5 * squared / max(global_values, 1.0) * world_size
        stats["value_loss"] = float(squared.detach() / max(local_values, 1.0))
    optimizer.zero_grad(set_to_none=True)
    # diagnostics are token-weighted sums over ranks; the caller divides by the tokens
    keys = [k for k in STAT_KEYS if k in stats]
    sums = all_reduce_sums(
        [float(share.detach()) / world_size * global_tokens, *(stats[k] * local_tokens for k in keys)]
    )
    report = {
        "loss": sums[0] / max(global_tokens, 1.0),
        **{k: s / max(global_tokens, 1.0) for k, s in zip(keys, sums[1:], strict=True)},
        "tokens": global_tokens,
        "skipped": 0.0,
    }
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
    if before_update is not None:
        before_update()
    optimizer.step()
    return report
