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
) -> list[float]:
    """Train next-token prediction on the masked positions of `examples`; save to `out_path`.

    With `lora`, only adapters of that shape train (a third less compute a step than the whole model, and
    optimizer state for about 1 % of the weights); they are merged into the base weights in float32 before
    saving, so `out_path` is a plain model folder either way. Returns the loss of every step; `on_step(step,
    loss)` is called after each (progress display).
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
    # a short linear warm-up, then cosine decay to a tenth: the last steps polish instead of jumping around,
    # which is what exact copying (a file name, an expression) needs
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (
            (s + 1) / warmup
            if s < warmup
            else 0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup)))
        ),
    )
    pad = tokenizer.pad_token_id or 0
    losses = []
    model.train()
    for _ in range(steps):
        batch = [examples[rng.randrange(len(examples))] for _ in range(min(batch_size, len(examples)))]
        width = max(len(ids) for ids, _ in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        labels = torch.full((len(batch), width), -100, dtype=torch.long)
        for row, (tokens, mask) in enumerate(batch):
            ids[row, : len(tokens)] = torch.tensor(tokens)
            labels[row, : len(tokens)] = torch.where(torch.tensor(mask) == 1, torch.tensor(tokens), -100)
        # right-padded and causal: no token sees the padding after it, so no mask (the kernel's fast path)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    if lora is not None:  # float32 weights: merging into bf16 would round the adapters' small update away
        model = model.merge_and_unload()
    model.save_pretrained(out_path, safe_serialization=True)
    tokenizer.save_pretrained(out_path)
    return losses
