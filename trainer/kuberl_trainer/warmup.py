"""The supervised warm-up: teach a fresh model the agent's tool format before RL.

A tiny model cannot discover the `<tool_call>` syntax by sampling, so RL would see no reward at all. The
warm-up plays scripted episodes against a real sandbox (run the tests, read the module, replace the buggy
text, run the tests again, submit) and fine-tunes on their calls. A fraction of the demonstrations
(`spec.training.warmup.expertFraction`) make the correct edit, the expression the failing test names; the
rest make a wrong edit (`wrongEdit`): the buggy expression copied back unchanged, or one of the task's wrong
candidate fixes written from memory. RL needs a policy that already succeeds sometimes
(every GRPO group of all-failures has zero advantage); with a mix, the warmed-up policy solves some tasks
and fails others, and a rise in the held-out solve rate afterwards is RL learning which of the two
behaviours it has seen the reward prefers.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kuberl.api.environment import Environments, Task, ToolCall
from kuberl.api.rljob import RLJob
from kuberl.api.spec import WrongEdit
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT
from kuberl.suites import environment_tasks
from kuberl_trainer.action_probes import mean_probability, play_probes
from kuberl_trainer.demonstrations import Demonstration, Slip, record_demonstration
from kuberl_trainer.scripted_episodes import scripted_calls
from kuberl_trainer.sft import supervised_fit


async def make_demonstrations(
    tasks: Sequence[Task],
    count: int,
    environments: Callable[[], Environments],
    chat: ChatFormat,
    seed: int = 0,
    concurrency: int = 8,
    system_prompt: str = SWE_SYSTEM_PROMPT,
    expert_fraction: float = 0.0,
    recovery_fraction: float = 0.0,
    wrong_edit: WrongEdit = WrongEdit.CANDIDATE,
) -> list[Demonstration]:
    """Play `count` scripted episodes (tasks in a seeded shuffled cycle) in environments opened by
    `environments()` (called here, in the event loop; demonstrations need no reward); returns them in order.
    round(count * expert_fraction) of them, spread evenly over the plan, make the correct edit; each
    recovers from a slipped edit with probability `recovery_fraction`, drawn apart from the expert plan."""
    if not tasks:
        raise ValueError("no tasks to demonstrate: check spec.environment.tasks")
    if not 0.0 <= expert_fraction <= 1.0:
        raise ValueError(f"spec.training.warmup.expertFraction must be between 0 and 1, got {expert_fraction}")
    if not 0.0 <= recovery_fraction <= 1.0:
        raise ValueError(f"spec.training.warmup.recoveryFraction must be between 0 and 1, got {recovery_fraction}")
    rng = random.Random(seed)
    order = list(tasks)
    rng.shuffle(order)
    plan = []
    for i in range(count):
        task = order[i % len(order)]
        # evenly spread (Bresenham): every stretch of the plan holds the same share of expert episodes
        expert = int((i + 1) * expert_fraction) > int(i * expert_fraction)
        recover = recovery_fraction > 0 and rng.random() < recovery_fraction  # no draw at 0: plans stay as before
        plan.append((task, scripted_calls(task, rng, expert, recover, wrong_edit)))
    opened = environments()
    slots = asyncio.Semaphore(concurrency)
    finished = 0

    async def play(task: Task, calls: list[ToolCall | Slip]) -> Demonstration:
        nonlocal finished
        async with slots:
            env = opened.open()
            try:
                demo = await record_demonstration(env, chat, system_prompt, task, calls)
            finally:
                await env.close()
        finished += 1
        if finished % max(count // 5, 1) == 0 or finished == count:
            print(f"warm-up: {finished}/{count} demonstrations played", flush=True)
        return demo

    try:
        return list(await asyncio.gather(*(play(task, calls) for task, calls in plan)))
    finally:
        await opened.aclose()


def warm_up(job: RLJob, model_path: str | Path, out_path: str | Path, environments: Callable[[], Environments]) -> dict:
    """Generate demonstrations on the training split, fine-tune `model_path` on them and save to `out_path`.

    Returns {demonstrations, tokens, max_tokens, steps, final_loss, demo_seconds, fit_seconds, seconds}."""
    from transformers import AutoTokenizer

    warmup, env = job.spec.training.warmup, job.spec.environment
    if warmup.demonstrations == 0:
        raise ValueError("spec.training.warmup.demonstrations is 0: the warm-up is off")
    started = time.monotonic()
    tasks = environment_tasks(env, str(env.tasks.split))
    chat = ChatFormat(AutoTokenizer.from_pretrained(model_path))
    demos = _play_demonstrations(job, tasks, environments, chat)
    longest = max(len(d.token_ids) for d in demos)
    demo_seconds = time.monotonic() - started
    print(
        f"warm-up: {len(demos)} demonstrations in {demo_seconds:.1f}s (longest {longest} tokens); "
        f"fine-tuning for {warmup.steps} steps",
        flush=True,
    )
    fit_started = time.monotonic()
    examples = [(d.token_ids, d.loss_mask) for d in demos]
    losses = supervised_fit(
        model_path,
        examples,
        out_path,
        steps=warmup.steps,
        learning_rate=warmup.learning_rate,
        batch_size=warmup.batch_size,
        seed=job.spec.training.seed,
        on_step=_progress_printer(warmup.steps, fit_started),
        lora=job.spec.model.lora,
        micro_batch_tokens=_micro_batch_tokens(job, model_path),
    )
    landing = land(job, out_path, examples, tasks, environments, chat)
    losses += landing.pop("losses")
    tail = losses[-10:]
    stats = {
        "demonstrations": len(demos),
        "tokens": sum(len(d.token_ids) for d in demos),
        "max_tokens": longest,
        "steps": len(losses),
        "first_loss": round(losses[0], 4),
        "final_loss": round(sum(tail) / len(tail), 4),  # the mean of the last steps: one batch is noisy
        **landing,
        "demo_seconds": round(demo_seconds, 1),
        "fit_seconds": round(time.monotonic() - fit_started, 1),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(
        f"warm-up: done, loss {stats['first_loss']} -> {stats['final_loss']} in {stats['seconds']}s; "
        f"model saved to {out_path}",
        flush=True,
    )
    return stats


def _play_demonstrations(job: RLJob, tasks: Sequence[Task], environments: Callable[[], Environments], chat) -> list:
    """The scripted demonstrations of spec.training.warmup, every one played to its submit."""
    warmup, env = job.spec.training.warmup, job.spec.environment
    print(
        f"warm-up: playing {warmup.demonstrations} demonstrations on {len(tasks)} {env.tasks.split} tasks "
        f"({warmup.expert_fraction:.0%} with the correct edit, the rest with the wrong edit '{warmup.wrong_edit}'; "
        f"{warmup.recovery_fraction:.0%} recovering from a slipped edit)",
        flush=True,
    )
    demos = asyncio.run(
        make_demonstrations(
            tasks,
            warmup.demonstrations,
            environments,
            chat,
            seed=job.spec.training.seed,
            expert_fraction=warmup.expert_fraction,
            recovery_fraction=warmup.recovery_fraction,
            wrong_edit=warmup.wrong_edit,
        )
    )
    unfinished = sum(not d.final_done for d in demos)
    if unfinished:
        raise RuntimeError(f"{unfinished} demonstrations never reached submit: the sandbox refused a scripted call")
    longest = max(len(d.token_ids) for d in demos)
    if longest > env.max_tokens_per_trajectory:
        # a demonstration the rollout tier would cut off teaches a workflow the agent cannot finish
        print(
            f"warm-up: warning: a demonstration has {longest} tokens, over maxTokensPerTrajectory "
            f"({env.max_tokens_per_trajectory})",
            flush=True,
        )
    return demos


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
    tasks: Sequence[Task],
    environments: Callable[[], Environments],
    chat: ChatFormat,
) -> dict:
    """The landing check (spec.training.warmup.landing): while the warmed-up model at `model_path` writes the
    correct edit on the probe tasks with a mean probability below `minCorrectEdit`, fine-tune it further in
    place. Returns {correct_edit (per check), extra_rounds, losses (of the further steps)}."""
    import torch
    from transformers import AutoModelForCausalLM

    warmup = job.spec.training.warmup
    rule = warmup.landing
    if rule.min_correct_edit <= 0:
        return {"correct_edit": [], "extra_rounds": 0, "losses": []}
    probed = list(tasks[: rule.probe_tasks])
    probes = asyncio.run(play_probes(probed, environments, chat, SWE_SYSTEM_PROMPT))
    checks: list[float] = []
    losses: list[float] = []
    for round_ in range(rule.max_rounds + 1):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        checks.append(float(f"{mean_probability(model, probes):.4g}"))
        del model
        landed = checks[-1] >= rule.min_correct_edit
        verdict = "landed" if landed else f"below landing.minCorrectEdit {rule.min_correct_edit:g}"
        print(
            f"warm-up: the policy writes the correct edit with probability {checks[-1]:.3g} on {len(probed)} "
            f"training tasks ({verdict})",
            flush=True,
        )
        if landed or round_ == rule.max_rounds:
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
    if checks[-1] < rule.min_correct_edit:
        print(
            f"warm-up: warning: still below landing.minCorrectEdit after {rule.max_rounds} more rounds: RL starts "
            f"with few successes to learn from",
            flush=True,
        )
    return {"correct_edit": checks, "extra_rounds": len(checks) - 1, "losses": losses}


def _micro_batch_tokens(job: RLJob, model_path: str | Path) -> int:
    """The learner's micro-batch rule (spec.learner.microBatchTokens, else the plan's budget): the warm-up runs
    in the learner's memory."""
    import torch

    from kuberl_trainer.policy import micro_batch_tokens

    return micro_batch_tokens(job.spec, str(model_path), torch.device("cpu"))
