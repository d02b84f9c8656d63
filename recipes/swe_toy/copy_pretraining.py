"""Copy pretraining: give a freshly built tiny model the one skill of a pretrained LLM the agent needs.

An agent copies from its context all the time (a file name from the prompt, a line from the file it read,
the expression a failing test names). A random tiny model cannot, and a few hundred supervised steps on
demonstrations do not teach it: measured on swe-toy held-out tasks after the warm-up, the file name in
the `replace` call was right in 2 of 84 calls (chance), 68 of 100 after this stage.

The stage trains next-token prediction on sequences of random tokens followed by their repeat, with the
loss on the repeat only: the only way to lower it is to look back (an induction head). A curriculum makes
the head form quickly: first short sequences over a small slice of the vocabulary, then the whole
vocabulary and longer sequences, so that every token's embedding takes part. It sees no task text, so it
teaches no answers.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class CopyStage:
    steps: int
    vocabulary: int | None
    """How many ordinary tokens the random sequences draw from (the most used ones); None: all of them."""
    min_length: int
    max_length: int
    learning_rate: float
    batch_size: int = 16
    replay: bool = False
    """Every other batch is drawn as in the first stage, so the head formed there is kept while the rest
    of the vocabulary joins."""


# Measured with hidden size 128, 2 layers (2026-12): the head forms between steps 500 and 600 of the first
# stage (loss 2.7 -> 0.2). The curriculum used before went from there straight to the whole vocabulary
# and sequences up to 300 tokens at 1e-3 with a fresh optimizer: the head was gone within 100 steps (loss
# back to ln(vocabulary) = 7.26, copy accuracy 1.00 -> 0.01), every time, whatever the machine's load.
# Now one optimizer runs through both stages, the second at half the learning rate, and half of its
# batches replay the first stage. Both draw from the tokens the text uses (token_ranking.json).
DEFAULT_CURRICULUM = (
    CopyStage(steps=900, vocabulary=128, min_length=8, max_length=40, learning_rate=1e-3, batch_size=32),
    CopyStage(steps=500, vocabulary=None, min_length=8, max_length=80, learning_rate=5e-4, batch_size=32, replay=True),
)
MIN_HEAD_ACCURACY = 0.9
"""Copy accuracy on the first stage's sequences below which the build fails: the head did not form or was lost."""
RECORD = "copy_pretraining.json"
RANKING = "token_ranking.json"
WARMUP_STEPS = 50


class CopyPretrainingFailed(RuntimeError):
    """The model did not learn to copy (or forgot it): the warm-up and RL would start from nothing."""


def copy_batch(generator, batch_size: int, length: int, tokens):
    """(input_ids, labels) for `batch_size` sequences x + x, x of `length` tokens drawn at random from the
    1-D tensor `tokens`; labels are -100 except on the repeat after its first token (which cannot be
    predicted: nothing says where the repeat starts)."""
    import torch

    x = tokens[torch.randint(0, len(tokens), (batch_size, length), generator=generator)]
    ids = torch.cat([x, x], dim=1)
    labels = ids.clone()
    labels[:, : length + 1] = -100
    return ids, labels


def token_ranking(path: Path, tokenizer) -> list[int]:
    """The ordinary tokens to copy, most used first: the model folder's ranking (how often the text its
    tokenizer was trained on uses each token, see recipes.swe_toy.tiny_model) or else every ordinary token in id
    order. Drawing the first stage from the most used tokens trains the embeddings that real text needs;
    the byte-level tokens at the start of the id order are almost never used once BPE has merged them."""
    ranked = path / RANKING
    if ranked.is_file():
        return [int(t) for t in json.loads(ranked.read_text())]
    first = max(tokenizer.all_special_ids) + 1  # special tokens come first in the vocabulary
    return list(range(first, len(tokenizer)))


def copy_accuracy(model, ids, length: int) -> float:
    """Greedy next-token accuracy on the predictable part of the repeat."""
    import torch

    with torch.no_grad():
        predicted = model(input_ids=ids).logits[:, length:-1].argmax(-1)
    return (predicted == ids[:, length + 1 :]).float().mean().item()


def pretrain_copying(
    path: str | Path,
    curriculum: tuple[CopyStage, ...] = DEFAULT_CURRICULUM,
    seed: int = 0,
    on_progress: Callable[[int, int, float, float], None] | None = None,
) -> list[float]:
    """Train the model at `path` in place on the copy curriculum; returns each stage's final accuracy
    (measured on a fixed probe of that stage's vocabulary, sequences it never trained on).

    `on_progress(stage, step, loss, accuracy)` is called every 50 steps and at the end of each stage.
    Raises CopyPretrainingFailed (and saves nothing) when, at the end, the model no longer copies the
    first stage's sequences."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ranking = torch.tensor(token_ranking(path, tokenizer))
    available = len(ranking)
    head = curriculum[0]

    def probe(vocabulary: int) -> float:
        ids, _ = copy_batch(torch.Generator().manual_seed(seed + 1), 16, 24, ranking[:vocabulary])
        model.eval()
        accuracy = copy_accuracy(model, ids, 24)
        model.train()
        return accuracy

    # one optimizer for the whole curriculum: a fresh one (no second-moment estimates) at a new stage's
    # learning rate is what wiped the head out before
    optimizer = torch.optim.AdamW(model.parameters(), lr=head.learning_rate, weight_decay=0.0)
    accuracies = []
    done = 0
    for index, stage in enumerate(curriculum):
        vocabulary = min(stage.vocabulary or available, available)
        for step in range(1, stage.steps + 1):
            for group in optimizer.param_groups:
                group["lr"] = stage.learning_rate * min(1.0, (done + 1) / WARMUP_STEPS)
            drawn = head if stage.replay and step % 2 == 0 else stage
            loss = _copy_step(model, optimizer, generator, drawn, ranking[: drawn.vocabulary or available])
            done += 1
            if (step % 50 == 0 or step == stage.steps) and on_progress is not None:
                on_progress(index, step, loss.item(), probe(vocabulary))
        accuracies.append(probe(vocabulary))
    kept = probe(min(head.vocabulary or available, available))
    if kept < MIN_HEAD_ACCURACY:
        raise CopyPretrainingFailed(
            f"copy pretraining of {path}: copy accuracy {kept:.2f} on the first stage's sequences at the end "
            f"(stages: {', '.join(f'{a:.2f}' for a in accuracies)}); the model cannot copy from its context. "
            f"Build it again with another --seed, and report it if it persists"
        )
    model.save_pretrained(path, safe_serialization=True)
    # a record beside the weights: `make demo` rebuilds a model that lacks it (one built before this stage)
    record = {"curriculum": [asdict(s) for s in curriculum], "accuracies": accuracies, "head_accuracy": kept}
    (path / RECORD).write_text(json.dumps(record))
    return accuracies


def _copy_step(model, optimizer, generator, stage: CopyStage, tokens):
    """One optimizer step on a batch of `stage`'s copy sequences drawn from `tokens`; returns its loss."""
    import torch

    length = int(torch.randint(stage.min_length, stage.max_length + 1, (1,), generator=generator))
    ids, labels = copy_batch(generator, stage.batch_size, length, tokens)
    loss = model(input_ids=ids, labels=labels).loss
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss
