"""Supervised fine-tuning on token sequences with a loss mask (the warm-up stage; test fixtures)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kuberl.api.spec import LoraSpec


def supervised_fit(
    model_path: str | Path,
    examples: Sequence[tuple[list[int], list[int]]],
    out_path: str | Path,
    steps: int = 200,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    seed: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    lora: LoraSpec | None = None,
    micro_batch_tokens: int | None = None,
) -> list[float]:
    """Train next-token prediction on the masked positions of `examples`; save to `out_path`.

    With `lora`, only adapters of that shape train (a third less compute a step than the whole model, and
    optimizer state for about 1 % of the weights); they are merged into the base weights in float32 before
    saving, so `out_path` is a plain model folder either way. A batch runs in micro-batches of rows of similar
    length whose padded tensor holds at most `micro_batch_tokens` (the learner's rule; None: the whole batch at
    once), gradients accumulated: the same step in less memory and less padding. Returns the loss of every
    step; `on_step(step, loss)` is called after each (progress display).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if lora is not None:
        from peft import get_peft_model

        from kuberl.modeling.lora import peft_config

        model = get_peft_model(model, peft_config(lora))
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=learning_rate, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _warmup_then_cosine(steps))
    pad = tokenizer.pad_token_id or 0
    losses = []
    model.train()
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(min(batch_size, len(examples)))]
        optimizer.zero_grad()
        losses.append(_accumulate_gradients(model, batch, pad, micro_batch_tokens))
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        if on_step is not None:
            on_step(len(losses), losses[-1])
    if lora is not None:  # float32 weights: merging into bf16 would round the adapters' small update away
        model = model.merge_and_unload()
    model.save_pretrained(out_path, safe_serialization=True)
    tokenizer.save_pretrained(out_path)
    return losses


def _warmup_then_cosine(steps: int) -> Callable[[int], float]:
    """A short linear warm-up, then cosine decay to a tenth: the last steps polish instead of jumping around,
    which is what exact copying (a file name, an expression) needs."""
    warmup = max(1, steps // 20)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return factor


def _accumulate_gradients(model, batch: Sequence[tuple[list[int], list[int]]], pad: int, budget: int | None) -> float:
    """Backpropagate the batch's mean loss over its trained tokens, one micro-batch at a time; returns it."""
    from kuberl_trainer.step import pack_by_tokens

    groups = pack_by_tokens([len(ids) for ids, _ in batch], budget)
    padded = [_padded([batch[i] for i in group], pad) for group in groups]
    # the model's loss is a mean over a micro-batch's predicted tokens (labels shifted by one): weighted by
    # their count, the micro-batches add up to the whole batch's mean
    counts = [int((labels[:, 1:] != -100).sum()) for _, labels in padded]
    total = max(1, sum(counts))
    loss_sum = 0.0
    for (ids, labels), count in zip(padded, counts, strict=True):
        if count == 0:
            continue
        # right-padded and causal: no token sees the padding after it, so no mask (the kernel's fast path)
        loss = model(input_ids=ids, labels=labels).loss * (count / total)
        loss.backward()
        loss_sum += loss.item()
    return loss_sum


def _padded(rows: Sequence[tuple[list[int], list[int]]], pad: int):
    """(input ids, labels: -100 where the mask is 0), right-padded to the longest row."""
    import torch

    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for row, (tokens, mask) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        labels[row, : len(tokens)] = torch.where(torch.tensor(mask) == 1, torch.tensor(tokens), -100)
    return ids, labels
