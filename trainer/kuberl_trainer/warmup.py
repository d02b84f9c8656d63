"""The supervised warm-up: fine-tune the model on a demonstrations dataset before RL.

A small or fresh model rarely samples a well-formed tool call, let alone a solution, so every GRPO group
would be all failures and carry no signal. The warm-up fine-tunes on the calls of demonstrated episodes
(spec.training.warmup.demonstrations), then checks where it landed (spec.training.warmup.landing): the
probability that the policy reproduces the dataset's successful demonstrations. A dataset mixing episodes
that solve their task and episodes that do not leaves a policy that solves some tasks and fails others, so
a rise in the held-out solve rate afterwards is RL learning which behaviour the reward prefers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kuberl.api.rljob import RLJob
from kuberl.demonstration_files import read_demonstrations
from kuberl.modeling.chat import ChatFormat
from kuberl_trainer.demonstrations import DemonstrationTokens, demonstration_tokens
from kuberl_trainer.sft import supervised_fit


def warm_up(job: RLJob, model_path: str | Path, out_path: str | Path) -> dict:
    """Fine-tune `model_path` on the job's demonstrations, check its landing, save to `out_path`.

    Returns {demonstrations, successful, tokens, max_tokens, steps, first_loss, final_loss, landing, landed,
    extra_rounds, fit_seconds, seconds}."""
    from transformers import AutoTokenizer

    warmup = job.spec.training.warmup
    if warmup.demonstrations is None:
        raise ValueError("spec.training.warmup.demonstrations is unset: the warm-up is off")
    started = time.monotonic()
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_path))
    demos = [demonstration_tokens(d, chat) for d in read_demonstrations(warmup.demonstrations)]
    _check_lengths(demos, job.spec.environment.max_tokens_per_trajectory)
    successful = sum(1 for d in demos if (d.reward or 0) > 0)
    print(
        f"warm-up: {len(demos)} demonstrations from {warmup.demonstrations} ({successful} successful); "
        f"fine-tuning for {warmup.steps} steps",
        flush=True,
    )
    examples = [(d.token_ids, d.loss_mask) for d in demos]
    losses = supervised_fit(
        model_path,
        examples,
        out_path,
        steps=warmup.steps,
        learning_rate=warmup.learning_rate,
        batch_size=warmup.batch_size,
        seed=job.spec.training.seed,
        on_step=_progress_printer(warmup.steps, started),
        lora=job.spec.model.lora,
        micro_batch_tokens=_micro_batch_tokens(job, model_path),
    )
    fit_seconds = time.monotonic() - started
    landing = land(job, out_path, examples, demos)
    losses += landing.pop("losses")
    tail = losses[-10:]
    stats = {
        "demonstrations": len(demos),
        "successful": successful,
        "tokens": sum(len(d.token_ids) for d in demos),
        "max_tokens": max(len(d.token_ids) for d in demos),
        "steps": len(losses),
        "first_loss": round(losses[0], 4),
        "final_loss": round(sum(tail) / len(tail), 4),  # the mean of the last steps: one batch is noisy
        **landing,
        "fit_seconds": round(fit_seconds, 1),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        f"warm-up: done, loss {stats['first_loss']} -> {stats['final_loss']} in {stats['seconds']}s; "
        f"model saved to {out_path}",
        flush=True,
    )
    return stats


def _check_lengths(demos: Sequence[DemonstrationTokens], limit: int) -> None:
    longest = max(len(d.token_ids) for d in demos)
    if longest > limit:
        # a demonstration the rollout tier would cut off teaches a workflow the agent cannot finish
        print(
            f"warm-up: warning: a demonstration has {longest} tokens, over maxTokensPerTrajectory ({limit})",
            flush=True,
        )


def _progress_printer(steps: int, started: float) -> Callable[[int, float], None]:
    """Every 25 steps, and at least every half minute: a pretrained model's step can take 20 s on a CPU."""
    shown = [started]

    def progress(step: int, loss: float) -> None:
        if step % 25 == 0 or step == steps or time.monotonic() - shown[0] >= 30:
            shown[0] = time.monotonic()
            print(f"warm-up: step {step}/{steps}, loss {loss:.3f}, {shown[0] - started:.0f}s", flush=True)

    return progress


def land(
    job: RLJob,
    model_path: str | Path,
    examples: list[tuple[list[int], list[int]]],
    demos: Sequence[DemonstrationTokens],
) -> dict:
    """The landing check (spec.training.warmup.landing): while the warmed-up model at `model_path` scores below
    `min`, fine-tune it further in place. Returns {landing (the metric at each check), landed, extra_rounds,
    losses (of the further steps)}."""
    warmup = job.spec.training.warmup
    rule = warmup.landing
    if rule.min <= 0 and rule.max >= 1:
        return {"landing": [], "landed": True, "extra_rounds": 0, "losses": []}
    probes = [d for d in demos if (d.reward or 0) > 0][: rule.probe_demonstrations]
    if not probes:
        raise ValueError(
            "spec.training.warmup.landing: no demonstration with a reward above 0 to score; give the "
            "successful demonstrations their reward in the dataset, or set landing.min to 0"
        )
    checks: list[float] = []
    losses: list[float] = []
    for round_ in range(rule.max_rounds + 1):
        checks.append(float(f"{demonstration_probability(model_path, probes):.4g}"))
        _say_where(checks[-1], len(probes), rule)
        if checks[-1] >= rule.min or round_ == rule.max_rounds:
            break
        print(f"warm-up: fine-tuning {rule.extra_steps} steps more (round {round_ + 1}/{rule.max_rounds})", flush=True)
        losses += supervised_fit(
            model_path,
            examples,
            model_path,
            steps=rule.extra_steps,
            learning_rate=rule.learning_rate,
            batch_size=warmup.batch_size,
            seed=job.spec.training.seed + round_ + 1,  # another draw of batches than the round before
            lora=job.spec.model.lora,
            micro_batch_tokens=_micro_batch_tokens(job, model_path),
        )
    landed = rule.min <= checks[-1] <= rule.max
    if checks[-1] < rule.min:
        print(
            f"warm-up: warning: still below landing.min after {rule.max_rounds} more rounds: RL starts with few "
            "successes to learn from",
            flush=True,
        )
    return {"landing": checks, "landed": landed, "extra_rounds": len(checks) - 1, "losses": losses}


def _say_where(value: float, probes: int, rule) -> None:
    if value < rule.min:
        verdict = f"below landing.min {rule.min:g}"
    elif value > rule.max:
        verdict = f"above landing.max {rule.max:g}: RL may find few groups that disagree; fewer steps would land lower"
    else:
        verdict = "landed"
    print(
        f"warm-up: the policy reproduces the successful demonstrations with probability {value:.3g} "
        f"(mean over {probes}; {verdict})",
        flush=True,
    )


def demonstration_probability(model_path: str | Path, demos: Sequence[DemonstrationTokens]) -> float:
    """The mean over `demos` of the probability, by teacher forcing, that the model at `model_path` writes every
    trained call of the demonstration (the product of their tokens' probabilities)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    values = []
    with torch.no_grad():
        for demo in demos:
            ids = torch.tensor([demo.token_ids])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
            picked = logprobs.gather(-1, ids[0, 1:, None])[:, 0]
            trained = torch.tensor(demo.loss_mask[1:], dtype=torch.bool)
            values.append(math.exp(picked[trained].sum().item()))
    return sum(values) / len(values)


def _micro_batch_tokens(job: RLJob, model_path: str | Path) -> int:
    """The learner's micro-batch rule (spec.learner.microBatchTokens, else the plan's budget): the warm-up runs
    in the learner's memory."""
    import torch

    from kuberl_trainer.policy import micro_batch_tokens

    return micro_batch_tokens(job.spec, str(model_path), torch.device("cpu"))
