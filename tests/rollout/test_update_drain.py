"""A weight update without partial rollouts waits for the episodes in flight; `rollout.updateDrainTimeout`
bounds that wait: episodes still running then are stopped (their environment closed) and played again from
the start on the new weights, so a trajectory still has one policy version and none is lost or delivered twice.
A cancelled group is not mistaken for a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from kuberl.api.environment import Task
from kuberl.api.trajectory import Trajectory
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.service import RESTART_LOG, RolloutService

QUICK, SLOW = generate(2, seed=5)


class Engine:
    def __init__(self) -> None:
        self.version = 0

    async def update_weights(self, files: list[Path], version: int, mode: str) -> None:
        self.version = version


class TimedAgent:
    """A QUICK episode takes 0.05 s; a SLOW one takes what `slow_plays` says, one entry per play (a minute-long
    test run, then a quick one). Each play records the versions it started and ended on and whether it closed."""

    def __init__(self, slow_plays: list[float]) -> None:
        self.engine = Engine()
        self.observe = None
        self.slow_plays = slow_plays
        self.plays: list[dict] = []

    async def run(self, env, task: Task, group_id: str, seed: int | None = None) -> Trajectory:
        play = {"task": task.task_id, "started_on": self.engine.version, "closed": False}
        self.plays.append(play)
        try:
            await asyncio.sleep(self.slow_plays.pop(0) if task.task_id == SLOW.task_id else 0.05)
        finally:
            play["closed"] = True  # the environment is closed however the play ends
        return Trajectory(
            trajectory_id=f"{group_id}-{seed}",
            task_id=task.task_id,
            group_id=group_id,
            token_ids=[1, 2, 3],
            loss_mask=[0, 1, 1],
            logprobs=[0.0, -0.5, -0.5],
            policy_versions=[-1, play["started_on"], self.engine.version],
            prompt_length=1,
            final_reward=1.0,
            finish_reason="submitted",
        )


def service(slow_plays: list[float]) -> RolloutService:
    return RolloutService(
        TimedAgent(slow_plays),
        object,  # the timed agent plays in no environment
        resolve_reward("swe-toy-tests"),
        {t.task_id: t for t in (QUICK, SLOW)},
        concurrent_sessions=8,
        metrics=RolloutMetrics(),
    )


def update(rollout: RolloutService, version: int, drain_timeout_s: float | None) -> asyncio.Task[None]:
    return asyncio.create_task(
        rollout.switch_policy(lambda: rollout.agent.engine.update_weights([], version, "wait"), False, drain_timeout_s)
    )


async def take_all(rollout: RolloutService, count: int) -> list[Trajectory]:
    found: list[Trajectory] = []
    async with asyncio.timeout(30):
        while len(found) < count:
            found += await rollout.take(count, wait_s=5)
    return found


def restarted(rollout: RolloutService) -> float:
    return rollout.metrics.episodes_restarted._value.get()


def one_version_each(trajectories: list[Trajectory]) -> set[int]:
    versions = set()
    for t in trajectories:
        sampled = {v for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m}
        assert len(sampled) == 1, f"trajectory {t.trajectory_id} mixes versions {sampled}"
        versions |= sampled
    return versions


async def test_without_a_drain_timeout_an_update_waits_for_the_slowest_episode():
    rollout = service(slow_plays=[1.0])
    rollout.submit(SLOW.task_id, None, 1, seed=1)
    rollout.submit(QUICK.task_id, None, 2, seed=2)
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await update(rollout, 1, None)
    assert loop.time() - started >= 0.9  # held until the slow episode ended
    trajectories = await take_all(rollout, 3)
    assert one_version_each(trajectories) == {0} and restarted(rollout) == 0


async def test_a_drain_timeout_restarts_the_episodes_still_running_on_the_new_weights(caplog):
    rollout = service(slow_plays=[60.0, 0.1])  # its first play would hold the update a minute
    slow = rollout.submit(SLOW.task_id, None, 1, seed=1)
    rollout.submit(QUICK.task_id, None, 2, seed=2)
    await asyncio.sleep(0.01)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await update(rollout, 1, drain_timeout_s=0.3)
    waited = loop.time() - started
    assert 0.3 <= waited < 2.0  # the quick episodes ended on version 0, the slow one was stopped
    assert rollout.agent.engine.version == 1
    quick_first = await take_all(rollout, 2)
    assert {t.task_id for t in quick_first} == {QUICK.task_id} and one_version_each(quick_first) == {0}
    [again] = await take_all(rollout, 1)
    assert again.group_id == slow.group_id and one_version_each([again]) == {1}  # played again, all on v1
    slow_plays = [p for p in rollout.agent.plays if p["task"] == SLOW.task_id]
    assert [p["started_on"] for p in slow_plays] == [0, 1] and all(p["closed"] for p in slow_plays)
    assert restarted(rollout) == 1
    [logged] = [r.getMessage() for r in caplog.records if RESTART_LOG in r.getMessage()]
    assert logged.startswith(f"{RESTART_LOG} 1 ")  # what bench_async counts
    info = rollout.describe(slow.group_id)
    assert (info.finished, info.running, info.cancelled) == (1, 0, False)  # delivered once, nothing lost
    assert await rollout.take(8, wait_s=0) == [] and rollout._running == 0 and rollout._open_episodes == 0


async def test_episodes_submitted_during_the_drain_wait_and_start_on_the_new_weights():
    rollout = service(slow_plays=[60.0, 0.1])
    rollout.submit(SLOW.task_id, None, 1, seed=1)
    await asyncio.sleep(0.01)
    updating = update(rollout, 1, drain_timeout_s=0.3)
    await asyncio.sleep(0.1)
    rollout.submit(QUICK.task_id, None, 2, seed=2)  # arrives while the update waits
    await updating
    trajectories = await take_all(rollout, 3)
    assert one_version_each(trajectories) == {1}
    assert [p["started_on"] for p in rollout.agent.plays if p["task"] == QUICK.task_id] == [1, 1]


async def test_a_cancelled_group_is_not_restarted():
    rollout = service(slow_plays=[60.0, 60.0])
    group = rollout.submit(SLOW.task_id, None, 2, seed=1)
    await asyncio.sleep(0.01)
    rollout.cancel(group.group_id)
    async with asyncio.timeout(5):
        while rollout._open_episodes:
            await asyncio.sleep(0.01)
    assert restarted(rollout) == 0 and rollout._running == 0
    assert len(rollout.agent.plays) == 2 and all(p["closed"] for p in rollout.agent.plays)
    assert rollout.describe(group.group_id).cancelled is True
