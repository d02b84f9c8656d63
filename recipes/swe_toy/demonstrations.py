"""The swe-toy demonstrations: scripted episodes played against a real sandbox, written as a warm-up dataset.

Each episode is recorded as a `kuberl.api.demonstrations.Demonstration` (the system prompt, the task's first
observation, then each call's text and the sandbox's answer), so the warm-up renders it with any policy's chat
template. A fraction of the episodes make the correct edit (the expression the failing test names); the rest
make a wrong edit (`WrongEdit`). RL needs a policy that already succeeds sometimes (every GRPO group of
all-failures has zero advantage); with a mix, the warmed-up policy solves some tasks and fails others, and a
rise in the held-out solve rate afterwards is RL learning which of the two behaviours the reward prefers.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kuberl.api.demonstrations import Demonstration, DemonstrationMessage, Role
from kuberl.api.environment import Environment, Environments, Task, ToolCall
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, ParseError, format_tool_call, parse_tool_call
from recipes.swe_toy.scripted_episodes import Slip, WrongEdit, scripted_calls


@dataclass(frozen=True)
class PlayedEpisode:
    demonstration: Demonstration
    finished: bool
    """The episode reached a step that ended it (the submit)."""


async def record_demonstration(
    env: Environment, system_prompt: str, task: Task, calls: Sequence[ToolCall | Slip]
) -> PlayedEpisode:
    """Play `calls` on `task` in `env` and record the conversation, up to the step that ends the episode. A
    `Slip`'s text is read as the rollout tier reads generated text (a parse error is its answer) and is shown
    with train: false. The demonstration's reward is the one the environment gives the final step."""
    messages = [
        DemonstrationMessage(role=Role.SYSTEM, content=system_prompt),
        DemonstrationMessage(role=Role.USER, content=await env.reset(task)),
    ]
    for call in calls:
        slip = isinstance(call, Slip)
        text = call.text if slip else format_tool_call(call)
        messages.append(DemonstrationMessage(role=Role.ASSISTANT, content=text, train=not slip))
        parsed = parse_tool_call(text) if slip else call
        if isinstance(parsed, ParseError):
            observation = parsed.message
        else:
            result = await env.step(parsed)
            if result.done:
                demo = Demonstration(task_id=task.task_id, messages=messages, reward=result.reward)
                return PlayedEpisode(demo, finished=True)
            observation = result.observation
        messages.append(DemonstrationMessage(role=Role.TOOL, content=observation))
    return PlayedEpisode(Demonstration(task_id=task.task_id, messages=messages), finished=False)


def demonstration_plan(
    tasks: Sequence[Task],
    count: int,
    seed: int = 0,
    expert_fraction: float = 0.0,
    recovery_fraction: float = 0.0,
    wrong_edit: WrongEdit = WrongEdit.CANDIDATE,
) -> list[tuple[Task, list[ToolCall | Slip]]]:
    """`count` (task, calls) pairs: tasks in a seeded shuffled cycle; round(count * expert_fraction) of them,
    spread evenly over the plan, make the correct edit; each recovers from a slipped edit with probability
    `recovery_fraction`, drawn apart from the expert plan."""
    if not tasks:
        raise ValueError("no tasks to demonstrate: check spec.environment.tasks")
    for name, value in (("expert_fraction", expert_fraction), ("recovery_fraction", recovery_fraction)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be between 0 and 1, got {value}")
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
    return plan


async def make_demonstrations(
    tasks: Sequence[Task],
    count: int,
    environments: Callable[[], Environments],
    seed: int = 0,
    concurrency: int = 8,
    system_prompt: str = SWE_SYSTEM_PROMPT,
    expert_fraction: float = 0.0,
    recovery_fraction: float = 0.0,
    wrong_edit: WrongEdit = WrongEdit.CANDIDATE,
) -> list[Demonstration]:
    """Play the `demonstration_plan` in environments opened by `environments()` (called here, in the event
    loop; they score with the job's reward function, whose final reward each demonstration keeps); returns
    the demonstrations in plan order. RuntimeError when an episode never reached its submit."""
    plan = demonstration_plan(tasks, count, seed, expert_fraction, recovery_fraction, wrong_edit)
    opened = environments()
    slots = asyncio.Semaphore(concurrency)
    finished = 0

    async def play(task: Task, calls: list[ToolCall | Slip]) -> PlayedEpisode:
        nonlocal finished
        async with slots:
            env = opened.open()
            try:
                played = await record_demonstration(env, system_prompt, task, calls)
            finally:
                await env.close()
        finished += 1
        if finished % max(count // 5, 1) == 0 or finished == count:
            print(f"demonstrations: {finished}/{count} played", flush=True)
        return played

    try:
        played = await asyncio.gather(*(play(task, calls) for task, calls in plan))
    finally:
        await opened.aclose()
    unfinished = sum(not p.finished for p in played)
    if unfinished:
        raise RuntimeError(f"{unfinished} demonstrations never reached submit: the sandbox refused a scripted call")
    return [p.demonstration for p in played]


def write_demonstrations(demos: Sequence[Demonstration], path: str | Path) -> Path:
    """Write `demos` as a demonstrations file (JSONL, camelCase), creating its folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d.to_manifest()) + "\n" for d in demos), encoding="utf-8")
    return path
