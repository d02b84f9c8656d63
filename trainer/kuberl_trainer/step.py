"""One training step on a shard of the global batch, normalised so every world size trains the same.

FSDP averages gradients over ranks, so each rank's loss is its share of the *global* token-mean (summed
per-token losses over the global number of loss tokens) times the world size. The batch may be split
into mini-batches (one optimizer update each, PPO-style, against the log-probs the policy had at the
start of the batch), and a mini-batch into micro-batches packed by a token budget whose gradients add
up: each micro-batch's loss is its part of the rank's token-mean (or seq-mean), so regrouping rows
changes nothing but the float summation order. An update whose loss or gradient norm is not finite is
skipped (gradients dropped) and reported.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist

from kuberl_trainer.algorithms.losses import LossConfig, denominators, policy_loss
from kuberl_trainer.distributed import all_reduce_sums
from kuberl_trainer.token_scores import score_tokens
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

    def columns(self, width: int) -> TokenBatch:
        """The first `width` positions of every row."""
        return TokenBatch(
            **{
                f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[:, :width]
                for f in fields(self)
            }
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
    chunk_tokens: int | None = None,
) -> Forward:
    """Token log-probs, entropies and (with a value head) values, aligned with the input tokens. Log-probs
    are of the distribution the rollout engine sampled from: the logits divided by its `temperature`.

    Log-probs and entropies are computed for tokens `from_position` onwards and are 0 before: an agent's
    first prompt (the task, the tools), which no loss reads, is most of T (`first_scored`). The logits are
    computed `chunk_tokens` at a time (kuberl_trainer/token_scores.py)."""
    if _right_padded(attention_mask):
        # causal attention never lets a token see the padding after it, and without a mask the attention
        # kernel takes its causal fast path (measured: a warm-up step about 20 % faster on CPU)
        attention_mask = None
    width = input_ids.shape[1]
    from_position = min(max(from_position, 1), width)
    head = getattr(model, VALUE_HEAD) if has_value_head(model) else None
    picked, entropy, values = score_tokens(
        model, input_ids, attention_mask, from_position, temperature, entropy_grad, head, chunk_tokens
    )
    before = picked.new_zeros((picked.shape[0], from_position))
    return Forward(torch.cat([before, picked], dim=1), torch.cat([before, entropy], dim=1), values)


def first_scored(loss_mask: torch.Tensor) -> int:
    """The first position any row's loss reads (1 when none does): where `forward` has to start."""
    columns = loss_mask.any(dim=0).nonzero()
    return max(int(columns[0]), 1) if len(columns) else 1


def _right_padded(attention_mask: torch.Tensor) -> bool:
    """Every row is ones, then zeros (never a zero before a one)."""
    return bool((attention_mask[:, 1:] <= attention_mask[:, :-1]).all())


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1, with 0 at t = 0, shape [B, T]."""
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    return forward(model, input_ids, attention_mask).logprobs


@torch.no_grad()
def predict(
    model,
    batch: TokenBatch,
    temperature: float = 1.0,
    from_position: int = 1,
    micro_batch_tokens: int | None = None,
    chunk_tokens: int | None = None,
    scored_rows_only: bool = False,
) -> Forward:
    """A forward pass without gradient (old log-probs, values for GAE, the reference policy), one micro-batch
    of at most `micro_batch_tokens` at a time (every rank runs as many); [B, T] results, 0 in rows left out
    (`scored_rows_only`: those without a loss or value token)."""
    rows, width = batch.input_ids.shape
    logprobs, entropy = torch.zeros(rows, width), torch.zeros(rows, width)
    values = torch.zeros(rows, width) if has_value_head(model) else None
    for index in micro_batches(batch, micro_batch_tokens, keep_empty_rows=not scored_rows_only):
        part, start = (batch.rows(index), from_position) if index is not None else (_idle(batch), 1)
        part = part.columns(used_width(part.attention_mask))
        out = forward(
            model,
            part.input_ids,
            part.attention_mask,
            temperature=temperature,
            from_position=start,
            chunk_tokens=chunk_tokens,
        )
        if index is None:
            continue
        cut = out.logprobs.shape[1]
        logprobs[index, :cut] = out.logprobs.to(logprobs.device, logprobs.dtype)
        entropy[index, :cut] = out.entropy.to(entropy.device, entropy.dtype)
        if values is not None:
            values[index, :cut] = out.values.to(values.device, values.dtype)
    device = batch.input_ids.device
    return Forward(logprobs.to(device), entropy.to(device), None if values is None else values.to(device))


def used_width(attention_mask: torch.Tensor) -> int:
    """Columns up to the last attended token of any row (the padding after it is cut off)."""
    columns = attention_mask.any(dim=0).nonzero()
    return int(columns[-1]) + 1 if len(columns) else 1


def row_lengths(attention_mask: torch.Tensor) -> list[int]:
    """Each row's tokens up to its last attended one (what it costs in a micro-batch)."""
    width = attention_mask.shape[1]
    last = torch.where(attention_mask.bool(), torch.arange(width, device=attention_mask.device), -1).max(dim=1).values
    return [int(x) + 1 for x in last.cpu()]


def micro_batches(
    batch: TokenBatch, token_budget: int | None, keep_empty_rows: bool = False
) -> list[torch.Tensor | None]:
    """This rank's micro-batches (row indices) of `batch` packed by `pack_by_tokens`, padded with None
    (an idle micro-batch) to the most any rank has: FSDP needs every rank in every forward and backward.
    Rows without a loss or value token are left out unless `keep_empty_rows`; there is always one."""
    rows = list(range(batch.input_ids.shape[0]))
    if not keep_empty_rows:
        scored = batch.loss_mask.any(dim=1)
        if batch.value_mask is not None:
            scored |= batch.value_mask.any(dim=1)
        rows = [r for r in rows if bool(scored[r])]
    lengths = row_lengths(batch.attention_mask)
    groups = pack_by_tokens([lengths[r] for r in rows], token_budget)
    mine: list[torch.Tensor | None] = [torch.tensor([rows[i] for i in g], dtype=torch.long) for g in groups]
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    counts = all_reduce_sums([float(len(mine)) if r == rank else 0.0 for r in range(world)])
    return mine + [None] * (max(1, int(max(counts))) - len(mine))


def pack_by_tokens(lengths: list[int], token_budget: int | None) -> list[list[int]]:
    """Micro-batches (indices into `lengths`) taken longest first: a micro-batch takes rows while their count
    times its longest row (the padded tensor) stays within `token_budget`; a row longer than the budget is a
    micro-batch of its own. No budget: one micro-batch of every row."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    if token_budget is None:
        return [order] if order else []
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _idle(batch: TokenBatch) -> TokenBatch:
    """A two-token micro-batch with nothing to learn from: a rank with fewer micro-batches than the others
    runs it, so every FSDP collective has every rank."""
    part = batch.rows(slice(0, 1)).columns(2)
    part.attention_mask = torch.ones_like(part.attention_mask)
    part.loss_mask = torch.zeros_like(part.loss_mask)
    if part.value_mask is not None:
        part.value_mask = torch.zeros_like(part.value_mask)
    return part


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
    micro_batch_tokens: int | None = None,
    chunk_tokens: int | None = None,
) -> StepReport:
    """Forward, backward, clip, step (per mini-batch); returns loss, grad norm, diagnostics (token-weighted
    over ranks and mini-batches) and the number of skipped updates. Every rank must have the same number
    of rows, at least `mini_batches` (pad with rows whose loss mask is empty). Each mini-batch's rows run in
    micro-batches of at most `micro_batch_tokens` (unset: one), whose gradients add up to the mini-batch's.
    `before_update` runs before each optimizer step (a checkpoint still copying the weights waits there, not
    before the forward). `ref_model` is a frozen copy, or the policy itself when it has LoRA adapters: the
    reference is then its base model, the adapters disabled."""
    start = first_scored(batch.loss_mask)
    parts = torch.tensor_split(torch.arange(batch.input_ids.shape[0]), mini_batches)
    plans = [micro_batches(batch.rows(part), micro_batch_tokens) for part in parts]
    # the old log-probs: the batch's start for mini-batches; with masked importance sampling also when a
    # mini-batch is split, because which tokens count (so the loss's denominator) depends on them
    needs_old = mini_batches > 1 or (loss_config.off_policy == "mis" and max(map(len, plans)) > 1)
    gradient_free = {
        "from_position": start,
        "micro_batch_tokens": micro_batch_tokens,
        "chunk_tokens": chunk_tokens,
        "scored_rows_only": True,
    }
    old, ref = _old_and_reference_logprobs(model, ref_model, batch, loss_config, needs_old, gradient_free)
    results = []
    for part, plan in zip(parts, plans, strict=True):
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
            plan,
            chunk_tokens,
        )
        results.append(result)
    return _step_report(results)


def _old_and_reference_logprobs(
    model, ref_model, batch: TokenBatch, loss_config: LossConfig, needs_old: bool, gradient_free: dict
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The policy's log-probs before the step (when `needs_old`) and the reference's (with a KL term)."""
    temperature = loss_config.temperature
    old = predict(model, batch, temperature, **gradient_free).logprobs if needs_old else None
    ref = None
    if ref_model is not None and loss_config.kl_coef:
        with _reference(model, ref_model):
            ref = predict(ref_model, batch, temperature, **gradient_free).logprobs
    return old, ref


def _step_report(results: list[dict[str, float]]) -> StepReport:
    """The mini-batches' results as one report: loss and diagnostics token-weighted, skips added, the mean
    of the finite gradient norms."""
    report: dict[str, float] = {"loss": 0.0, "skipped": 0.0, "grad_norm": 0.0, **dict.fromkeys(STAT_KEYS, 0.0)}
    total_tokens = 0.0
    norms = []
    for result in results:
        result = dict(result)
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


def _reference(model, ref_model) -> contextlib.AbstractContextManager:
    """Adapters off while the policy serves as its own reference (LoRA: no second copy of the weights)."""
    return model.disable_adapter() if ref_model is model else contextlib.nullcontext()


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
    plan: list[torch.Tensor | None],
    chunk_tokens: int | None,
) -> dict[str, float]:
    # every forward of a step starts at the same position: old, reference and new log-probs share their zeros
    local_tokens = float(batch.loss_mask.sum())
    local_values = float(batch.value_mask.sum()) if batch.value_mask is not None else 0.0
    global_tokens, global_values = all_reduce_sums([local_tokens, local_values])
    # the rank's loss is its token share of the global loss; each micro-batch adds its part of the rank's
    scale = local_tokens / max(global_tokens, 1.0) * world_size
    totals = _denominators(batch, old_logprobs, config)
    sums = dict.fromkeys(("share", *STAT_KEYS), 0.0)
    counts = _Counts(local_tokens, local_values, global_values, scale, world_size)
    for i, index in enumerate(plan):
        share, stats = _micro_batch_loss(
            model,
            batch,
            index,
            config,
            old_logprobs,
            ref_logprobs,
            value_coef,
            from_position,
            chunk_tokens,
            totals,
            counts,
        )
        if i == 0:
            # after the first forward: the gradients of the last update lived until here, not through it
            optimizer.zero_grad(set_to_none=True)
        sums["share"] += float(share.detach())
        for key in STAT_KEYS:
            sums[key] += stats.get(key, 0.0)
        share.backward()
    # diagnostics are token-weighted sums over ranks; the caller divides by the tokens
    reduced = all_reduce_sums(
        [sums["share"] / world_size * global_tokens, *(sums[k] * local_tokens for k in STAT_KEYS)]
    )
    report = {
        "loss": reduced[0] / max(global_tokens, 1.0),
        **{k: s / max(global_tokens, 1.0) for k, s in zip(STAT_KEYS, reduced[1:], strict=True)},
        "tokens": global_tokens,
        "skipped": 0.0,
    }
    report.update(_clip_and_step(model, optimizer, max_grad_norm, before_update, math.isfinite(report["loss"])))
    return report


def _denominators(batch: TokenBatch, old_logprobs: torch.Tensor | None, config: LossConfig):
    """The loss's denominators over the whole mini-batch, or None where each micro-batch finds its own (masked
    importance sampling against the rollout's log-probs, the mini-batch in one piece)."""
    if old_logprobs is None and config.off_policy == "mis":
        return None
    return denominators(
        batch.loss_mask,
        batch.rollout_logprobs if old_logprobs is None else old_logprobs,
        batch.rollout_logprobs,
        config,
    )


def _clip_and_step(
    model, optimizer, max_grad_norm: float, before_update: Callable[[], None] | None, finite_loss: bool
) -> dict[str, float]:
    """Clip the gradients and step; an update whose loss or gradient norm is not finite is skipped (cleared)."""
    if not finite_loss:
        optimizer.zero_grad(set_to_none=True)
        return {"skipped": 1.0, "grad_norm": float("nan")}
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return {"skipped": 1.0, "grad_norm": norm}
    if before_update is not None:
        before_update()
    optimizer.step()
    return {"grad_norm": norm}


@dataclass(frozen=True)
class _Counts:
    """A rank's and the world's token counts that scale each micro-batch's share of the loss."""

    local_tokens: float
    local_values: float
    global_values: float
    scale: float  # the rank's token share of the global loss, times the world size
    world_size: int


def _micro_batch_loss(
    model,
    batch: TokenBatch,
    index: torch.Tensor | None,
    config: LossConfig,
    old_logprobs: torch.Tensor | None,
    ref_logprobs: torch.Tensor | None,
    value_coef: float,
    from_position: int,
    chunk_tokens: int | None,
    totals,
    counts: _Counts,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One micro-batch's forward: its share of the rank's loss (to backward) and its diagnostics. `index` None:
    an idle micro-batch (a rank with fewer micro-batches than the busiest), whose loss is 0."""
    micro = batch.rows(index) if index is not None else _idle(batch)
    micro = micro.columns(used_width(micro.attention_mask))
    width = micro.input_ids.shape[1]
    old = None if old_logprobs is None or index is None else old_logprobs[index, :width]
    ref = None if ref_logprobs is None or index is None else ref_logprobs[index, :width]
    result = forward(
        model,
        micro.input_ids,
        micro.attention_mask,
        entropy_grad=config.entropy_coef > 0,
        temperature=config.temperature,
        from_position=from_position if index is not None else 1,
        chunk_tokens=chunk_tokens,
    )
    logprobs = result.logprobs
    old = logprobs.detach() if old is None else old
    # without old log-probs there is one micro-batch (train_step), so its own are the whole's
    micro_totals = totals or denominators(micro.loss_mask, old, micro.rollout_logprobs, config)
    loss, stats = policy_loss(
        logprobs,
        old,
        micro.rollout_logprobs,
        micro.advantages,
        micro.loss_mask,
        config,
        entropy=result.entropy,
        ref_logprobs=ref,
        totals=micro_totals,
    )
    share = loss * counts.scale
    mask = micro.loss_mask.to(logprobs.dtype)
    stats["entropy"] = float((result.entropy.detach() * mask).sum() / max(counts.local_tokens, 1.0))
    if ref is not None:
        kl = torch.exp(ref - logprobs.detach()) - 1 - (ref - logprobs.detach())
        stats["kl_ref"] = float((kl * mask).sum() / max(counts.local_tokens, 1.0))
    if result.values is not None and micro.returns is not None and value_coef:
        vmask = micro.value_mask.to(result.values.dtype)
        squared = ((result.values - micro.returns) ** 2 * vmask).sum()
        share = share + value_coef * 0.5 * squared / max(counts.global_values, 1.0) * counts.world_size
        stats["value_loss"] = float(squared.detach() / max(counts.local_values, 1.0))
    return share, stats
