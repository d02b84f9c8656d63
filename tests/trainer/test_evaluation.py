"""Held-out evaluation: every task's episodes are scored once, a full backlog only delays submission, and
trajectories of groups the evaluation did not submit (a learner's) are left out of the score."""

from __future__ import annotations

import httpx
import pytest

from kuberl.api.trajectory import Trajectory
from kuberl.suites import load_tasks
from kuberl_app.one_machine.evaluate import summary_line
from kuberl_trainer.evaluation import evaluate
from kuberl_trainer.rollout_client import Collected, SubmittedGroup


def trajectory(
    group_id: str, task_id: str, reward: float, finish: str = "submitted", resolved: bool | None = None
) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group_id}-{reward}-{finish}-{resolved}",
        task_id=task_id,
        group_id=group_id,
        token_ids=[1, 2, 3],
        loss_mask=[0, 1, 1],
        logprobs=[0.0, -0.5, -0.5],
        policy_versions=[-1, 4, 4],
        prompt_length=1,
        final_reward=reward,
        finish_reason=finish,
        resolved=resolved,
        error="sandbox failed" if finish == "error" else None,
    )


class FakeRolloutServer:
    """Episodes finish one poll after submission; the backlog holds `capacity` groups; a learner's
    trajectory is waiting in the outbox from the start."""

    def __init__(self, rewards: dict[str, list[float]], capacity: int) -> None:
        self.rewards, self.capacity = rewards, capacity
        self.outbox = [trajectory("learner-group", "swe-toy-0001", 1.0)]
        self.open: list[SubmittedGroup] = []
        self.refused = 0

    def submit_task(self, task, size: int, seed: int) -> SubmittedGroup:
        if len(self.open) >= self.capacity:
            self.refused += 1
            request = httpx.Request("POST", "http://rollout/v1/groups")
            raise httpx.HTTPStatusError("429", request=request, response=httpx.Response(429, request=request))
        group = SubmittedGroup(f"g{task.task_id}", task.task_id, seed, size, 0)
        self.open.append(group)
        return group

    def collect(self, wait: float) -> Collected:
        done, self.open = self.open, []
        for group in done:
            self.outbox += [trajectory(group.group_id, group.task_id, r) for r in self.rewards[group.task_id]]
        out, self.outbox = self.outbox, []
        return Collected(trajectories=out)


def test_solve_rate_counts_full_rewards_of_its_own_groups_only():
    tasks = load_tasks("swe-toy", split="test")[:4]
    rewards = dict(zip([t.task_id for t in tasks], [[1.0, 1.0], [1.0, 0.4], [0.8, 0.0], [0.0, 0.0]], strict=True))
    server = FakeRolloutServer(rewards, capacity=2)
    result = evaluate(server, tasks, episodes_per_task=2, poll=0)
    assert (result.tasks, result.episodes, result.solved) == (4, 8, 3)
    assert result.solve_rate == pytest.approx(3 / 8)
    assert result.reward_mean == pytest.approx(4.2 / 8)
    assert result.foreign == 1  # the learner's trajectory is not scored
    assert server.refused >= 1  # the full backlog was waited out, not an error
    assert result.generated_tokens == 16


def test_an_errored_episode_is_unsolved_and_counted():
    task = load_tasks("swe-toy", split="test")[0]

    class Failing(FakeRolloutServer):
        def collect(self, wait: float) -> Collected:
            done, self.open = self.open, []
            return Collected(trajectories=[trajectory(g.group_id, g.task_id, 0.0, "error") for g in done])

    result = evaluate(Failing({}, capacity=8), [task], poll=0)
    assert (result.solved, result.failed, result.submitted) == (0, 1, 0)
    assert result.errors == {"sandbox failed": 1}  # why they failed travels with the count
    assert summary_line(result.summary()).endswith("\n  1 failed: sandbox failed")


def test_the_summary_says_how_the_unsubmitted_episodes_ended():
    task = load_tasks("swe-toy", split="test")[0]
    endings = ["submitted", "max_turns", "max_turns", "max_tokens", "error"]

    class Ending(FakeRolloutServer):
        def collect(self, wait: float) -> Collected:
            done, self.open = self.open, []
            return Collected(
                trajectories=[trajectory(g.group_id, g.task_id, 0.0, finish) for g in done for finish in endings]
            )

    result = evaluate(Ending({}, capacity=8), [task], episodes_per_task=len(endings), poll=0)
    assert result.finish_reasons == {"max_turns": 2, "submitted": 1, "max_tokens": 1, "error": 1}
    assert "(not submitted: 2 max_turns, 1 max_tokens)" in summary_line(result.summary())


def test_the_resolved_flag_decides_solved_where_the_trajectory_carries_it():
    task = load_tasks("swe-toy", split="test")[0]
    # (reward, resolved): the flag wins over the reward; without it, a full reward solves
    episodes = [(1.0, True), (0.0, True), (1.0, False), (1.0, None), (0.5, None)]

    class Resolving(FakeRolloutServer):
        def collect(self, wait: float) -> Collected:
            done, self.open = self.open, []
            return Collected(
                trajectories=[trajectory(g.group_id, g.task_id, r, resolved=v) for g in done for r, v in episodes]
            )

    result = evaluate(Resolving({}, capacity=8), [task], episodes_per_task=len(episodes), poll=0)
    assert (result.episodes, result.solved) == (5, 3)
