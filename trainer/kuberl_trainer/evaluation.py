"""Held-out evaluation: the solve rate of the policy a rollout server serves now, on a list of tasks.

Tasks are submitted inline (the server need not know them), so any split or file can be evaluated.
A rollout server hands each finished trajectory to whoever polls first, so an evaluation must not share a
server with a running learner: run it on a server of its own, or between training runs. Trajectories
of groups this evaluation did not submit are counted as `foreign` and dropped.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import httpx

from kuberl.api.environment import Task
from kuberl.api.trajectory import FinishReason, Trajectory
from kuberl_trainer.rollout_client import RolloutClient

SOLVED = 1.0
"""Without a `resolved` flag (a task without failToPass), a trajectory solves its task when its final reward
reaches this."""


def is_solved(trajectory: Trajectory) -> bool:
    """The episode solved its task: it resolved it (SWE-bench), else its final reward reached SOLVED; never on error."""
    if trajectory.error is not None:
        return False
    return trajectory.resolved if trajectory.resolved is not None else trajectory.final_reward >= SOLVED


@dataclass(frozen=True)
class Evaluation:
    tasks: int
    episodes: int
    solved: int
    solve_rate: float
    """Solved episodes over all episodes (errors count as unsolved)."""
    reward_mean: float
    submitted: int
    """Episodes that ended with submit (the rest ran out of turns or tokens, or failed)."""
    failed: int
    """Episodes that ended with an error (sandbox or engine), counted as unsolved."""
    finish_reasons: dict[str, int]
    """How the episodes ended (`submitted`, `max_turns`, `max_tokens`, `timeout`, `error`) and how many ended so:
    a policy that loops on broken calls shows as `max_turns`, one that gives up early as `submitted`."""
    errors: dict[str, int]
    """The commonest reasons of the failed episodes (at most three, cut at 160 characters) and their counts."""
    foreign: int
    generated_tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.generated_tokens / max(self.seconds, 1e-9)

    def summary(self) -> dict:
        return {**asdict(self), "tokens_per_second": round(self.tokens_per_second, 1)}


def evaluate(
    client: RolloutClient,
    tasks: Sequence[Task],
    episodes_per_task: int = 1,
    seed: int = 0,
    timeout: float = 900.0,
    poll: float = 2.0,
) -> Evaluation:
    """Run `episodes_per_task` episodes of every task on the served policy and score them."""
    if not tasks:
        raise ValueError("no tasks to evaluate")
    started = time.monotonic()
    waiting = list(tasks)
    mine: dict[str, int] = {}  # group id -> episodes still to arrive
    found: list[Trajectory] = []
    foreign = 0
    while waiting or mine:
        if time.monotonic() - started > timeout:
            raise TimeoutError(
                f"evaluation: {len(found)} of {len(tasks) * episodes_per_task} episodes after {timeout:.0f}s"
            )
        while waiting:
            try:
                group = client.submit_task(waiting[0], episodes_per_task, seed + len(tasks) - len(waiting))
            except httpx.HTTPStatusError as err:
                if err.response.status_code == 429 and mine:  # backlog full: collect, then submit the rest
                    break
                raise
            waiting.pop(0)
            mine[group.group_id] = group.size
        collected = client.collect(wait=poll)
        if collected.lost:
            raise RuntimeError(f"evaluation: rollout server(s) {collected.lost} went down or restarted; run it again")
        for trajectory in collected.trajectories:
            if trajectory.group_id not in mine:
                foreign += 1
                continue
            found.append(trajectory)
            mine[trajectory.group_id] -= 1
            if mine[trajectory.group_id] == 0:
                del mine[trajectory.group_id]
    return _score(found, len(tasks), foreign, time.monotonic() - started)


def _score(trajectories: list[Trajectory], tasks: int, foreign: int, seconds: float) -> Evaluation:
    solved = sum(is_solved(t) for t in trajectories)
    endings = Counter(str(t.finish_reason) for t in trajectories)
    return Evaluation(
        tasks=tasks,
        episodes=len(trajectories),
        solved=solved,
        solve_rate=solved / len(trajectories),
        reward_mean=sum(t.final_reward for t in trajectories) / len(trajectories),
        submitted=endings[FinishReason.SUBMITTED],
        failed=endings[FinishReason.ERROR],
        finish_reasons=dict(endings.most_common()),
        errors=dict(
            Counter(
                (t.error or "no reason recorded")[:160] for t in trajectories if t.finish_reason == FinishReason.ERROR
            ).most_common(3)
        ),
        foreign=foreign,
        generated_tokens=sum(sum(t.loss_mask) for t in trajectories),
        seconds=seconds,
    )
