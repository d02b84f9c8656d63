"""How batches are cut: whole groups, sync versus async refills, the staleness bound, and dynamic sampling.

The rollout servers are replaced by an in-memory work queue that finishes groups when the test says,
at the policy version the test says (the real servers are exercised in test_learner_loop.py)."""

from __future__ import annotations

import itertools

import pytest

from kuberl.api.trajectory import Trajectory
from kuberl_trainer.rollout_client import Collected, NoRolloutServer, SubmittedGroup
from kuberl_trainer.rollout_feed import FeedState, RolloutFeed, admissible, staleness


def trajectory(
    group_id: str,
    task_id: str,
    index: int,
    version: int,
    error: str | None = None,
    reward: float | None = None,
    tampering: str | None = None,
) -> Trajectory:
    return Trajectory(
        trajectory_id=f"{group_id}-{index}",
        task_id=task_id,
        group_id=group_id,
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0, 0, -1, -1],
        policy_versions=[-1, -1, version, version],
        prompt_length=2,
        final_reward=float(index) if reward is None else reward,
        finish_reason="error" if error else "submitted",
        error=error,
        tampering=tampering,
    )


class WorkQueue:
    """Groups submitted; `finish(version)` completes every open one as if sampled by `version`. Members
    of a group get different rewards, except for the tasks in `uniform` (all 0: too hard). In the tasks of
    `tampered`, the members that score 0 forged their test report (the sandbox scored them 0 for it)."""

    def __init__(self, servers: int = 1) -> None:
        self.ids = itertools.count()
        self.open: list[SubmittedGroup] = []
        self.done: list[Trajectory] = []
        self.submitted: list[SubmittedGroup] = []
        self.servers, self.down, self.lost = servers, set(), []
        self.uniform: set[str] = set()
        self.tampered: set[str] = set()

    def crash(self, server: int) -> None:
        """The server dies with its open groups; the next collect reports it lost."""
        self.open = [g for g in self.open if g.server != server]
        self.down.add(server)
        self.lost.append(server)

    def submit(self, task_id: str, size: int, seed: int) -> SubmittedGroup:
        up = [s for s in range(self.servers) if s not in self.down]
        if not up:
            raise NoRolloutServer("all down")
        group = SubmittedGroup(f"g{next(self.ids)}", task_id, seed, size, up[len(self.submitted) % len(up)])
        self.open.append(group)
        self.submitted.append(group)
        return group

    def finish(self, version: int, count: int | None = None, error_first: bool = False) -> None:
        finishing, self.open = self.open[:count], self.open[len(self.open[:count]) :]
        for g in finishing:
            for i in range(g.size):
                reward = 0.0 if g.task_id in self.uniform else float(i)
                forged = "missing_answers" if g.task_id in self.tampered and reward == 0.0 else None
                self.done.append(
                    trajectory(
                        g.group_id,
                        g.task_id,
                        i,
                        version,
                        "sandbox lost" if error_first and i == 0 else None,
                        reward,
                        forged,
                    )
                )

    def collect(self, wait: float) -> Collected:
        out, self.done = self.done, []
        lost, self.lost = self.lost, []
        return Collected(out, lost=lost)


def differ(group: list[Trajectory]) -> bool:
    return len({t.final_reward for t in group}) > 1


def feed(
    queue: WorkQueue,
    asynchronous: bool,
    max_staleness: int = 1,
    state: FeedState | None = None,
    has_signal=None,
    on_drop=None,
    on_tampered=None,
    oversampling: float = 1.0,
):
    return RolloutFeed(
        queue,
        [f"t{i}" for i in range(10)],
        group_size=2,
        groups_per_step=2,
        asynchronous=asynchronous,
        max_staleness=max_staleness,
        seed=100,
        state=state,
        has_signal=has_signal,
        on_drop=on_drop,
        on_tampered=on_tampered,
        oversampling=oversampling,
    )


def test_staleness_counts_versions_behind_the_oldest_token():
    t = trajectory("g", "t", 0, version=3)
    assert staleness(t, 5) == 2 and staleness(t, 3) == 0 and staleness(t, 1) == 0
    assert admissible([t], 4, 1) and not admissible([t], 5, 1)


def test_sync_submits_one_batch_then_waits_for_all_of_it():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    polls = iter(range(100))

    def stop() -> bool:  # the rollout servers finish the groups while the feed waits
        if next(polls) == 1:
            queue.finish(version=0)
        return False

    batch = f.next_batch(version=0, stop=stop, poll=0)
    assert [g.task_id for g in queue.submitted] == ["t0", "t1"]  # exactly one batch, no more
    assert [g.seed for g in queue.submitted] == [100, 101]
    assert len(batch.trajectories) == 4 and batch.staleness == [0, 0, 0, 0]
    assert [t.group_id for t in batch.trajectories] == ["g0", "g0", "g1", "g1"]  # groups stay together
    assert not queue.open  # nothing is generated with the old weights while the step trains


def test_async_keeps_the_next_batches_in_flight_while_training():
    queue = WorkQueue()
    f = feed(queue, asynchronous=True, max_staleness=1)
    in_flight = []

    def servers_finish_two_groups() -> bool:
        in_flight.append(len(queue.open))
        queue.finish(version=0, count=2)
        return False

    batch = f.next_batch(version=0, stop=servers_finish_two_groups, poll=0)
    assert in_flight[0] == 4  # (1 + maxStaleness) batches in flight from the start
    assert len(batch.trajectories) == 4
    assert len(queue.open) == 4  # refilled at once: generation continues during the step


def test_async_drops_and_resubmits_groups_beyond_the_staleness_bound():
    queue = WorkQueue()
    f = feed(queue, asynchronous=True, max_staleness=1)
    # four groups sampled by version 0, trained at version 1 (staleness 1: admitted)
    batch = f.next_batch(version=1, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert batch.staleness == [1] * 4 and batch.stale_dropped == 0
    # the other two groups wait in `ready`; by version 2 they are 2 behind and must go
    queue.finish(version=2)

    batch = f.next_batch(version=2, stop=lambda: False, poll=0)
    assert batch.stale_dropped == 4 and batch.staleness == [0] * 4
    resubmitted = [g.task_id for g in queue.submitted[6:8]]  # after t0-t3, then t4-t5 (the refill)
    assert sorted(resubmitted) == ["t2", "t3"]  # the dropped groups' tasks are generated again


def test_a_group_with_a_failed_episode_is_run_again():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    attempts = iter([True, False])  # the first run loses its sandbox, the re-run is fine

    def servers() -> bool:
        if queue.open:
            queue.finish(version=0, error_first=next(attempts, False))
        return False

    batch = f.next_batch(version=0, stop=servers, poll=0)
    assert batch.failed == 0 and len(batch.trajectories) == 4 and batch.resubmitted == 2
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t0", "t1"]  # same tasks, same seeds
    assert [g.seed for g in queue.submitted[2:]] == [100, 101]


def test_the_groups_of_a_lost_server_are_submitted_again_elsewhere():
    queue = WorkQueue(servers=2)
    f = feed(queue, asynchronous=False)
    polls = itertools.count()

    def servers() -> bool:
        if next(polls) == 0:
            queue.crash(1)  # one of the two groups was on server 1
        else:
            queue.finish(version=0)
        return False

    batch = f.next_batch(version=0, stop=servers, poll=0)
    assert len(batch.trajectories) == 4 and batch.resubmitted == 1
    assert sorted(t.task_id for t in batch.trajectories) == ["t0", "t0", "t1", "t1"]
    assert queue.submitted[-1].server == 0


def test_when_every_server_is_down_groups_wait_and_are_placed_later():
    queue = WorkQueue()
    queue.down.add(0)
    f = feed(queue, asynchronous=False)
    polls = itertools.count()

    def servers() -> bool:
        if next(polls) == 2:
            queue.down.clear()  # the replacement is up
        queue.finish(version=0)
        return False

    batch = f.next_batch(version=0, stop=servers, poll=0)
    assert len(batch.trajectories) == 4 and [g.task_id for g in queue.submitted] == ["t0", "t1"]


def test_a_server_lost_between_two_submissions_of_a_wave_leaves_no_group_out():
    """The server dies after taking the wave's first group and before its second: the second waits for a
    server like the first (resubmitted), and the batch is the whole wave once the replacement is up."""
    queue = WorkQueue()
    submit, crashed = queue.submit, []

    def dies_after_the_first(task_id: str, size: int, seed: int) -> SubmittedGroup:
        if len(queue.submitted) == 1 and not crashed:
            crashed.append(queue.crash(0))
        return submit(task_id, size, seed)

    queue.submit = dies_after_the_first
    f = feed(queue, asynchronous=False)
    polls = itertools.count()

    def servers() -> bool:
        poll = next(polls)
        if poll == 2:
            queue.down.clear()  # the replacement is up
        queue.finish(version=0)
        return poll > 50  # a wave left short would wait forever: give up, and fail below

    batch = f.next_batch(version=0, stop=servers, poll=0)
    assert batch is not None and len(batch.trajectories) == 4
    assert sorted({t.task_id for t in batch.trajectories}) == ["t0", "t1"]


def test_errored_trajectories_are_left_out_and_counted_after_the_reruns():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0, error_first=True) or False, poll=0)
    assert batch.failed == 2 and len(batch.trajectories) == 2
    assert all(t.error is None for t in batch.trajectories)


def test_a_stop_request_ends_the_wait():
    queue = WorkQueue()
    assert feed(queue, asynchronous=False).next_batch(version=0, stop=lambda: True, poll=0) is None


def test_the_checkpointed_state_restores_ready_groups_and_resubmits_in_flight_ones():
    queue = WorkQueue()
    f = feed(queue, asynchronous=True, max_staleness=1)
    f.next_batch(version=0, stop=lambda: queue.finish(version=0, count=3) or False, poll=0)
    # it took 2 groups; 1 is ready, 3 in flight (1 from the start, 2 refilled)
    state = f.state()
    assert len(state.ready) == 2 and len(state.in_flight) == 3 and state.task_cursor == 6

    queue2 = WorkQueue()
    resumed = feed(queue2, asynchronous=True, max_staleness=1, state=state)
    assert sorted((g.task_id, g.seed) for g in queue2.submitted) == sorted(state.in_flight)
    queue2.finish(version=0, count=1)
    batch = resumed.next_batch(version=1, stop=lambda: False, poll=0)
    assert len(batch.trajectories) == 4
    assert {t.task_id for t in batch.trajectories} >= {"t2"}  # the ready group from before the restart


def test_trajectories_of_unknown_groups_are_ignored():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    queue.done.append(trajectory("from-a-previous-learner", "t9", 0, 0))
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert len(batch.trajectories) == 4 and f.orphans == 1


@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_task_cursor_walks_the_tasks_in_order(asynchronous):
    queue = WorkQueue()
    f = feed(queue, asynchronous=asynchronous)
    for version in range(3):
        f.next_batch(version=version, stop=lambda v=version: queue.finish(version=v) or False, poll=0)
    tasks = [g.task_id for g in queue.submitted]
    assert tasks == [f"t{i}" for i in range(len(tasks))]


# ------------------------------------------------------------------------------------ dynamic sampling
def test_sync_drops_groups_without_signal_and_draws_more_until_the_batch_is_full():
    queue = WorkQueue()
    queue.uniform = {"t0", "t2"}
    dropped = []
    f = feed(queue, asynchronous=False, has_signal=differ, on_drop=lambda: dropped.append(1))
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    # t0 and t2 had one reward for all members: each was dropped and the next task drawn at once
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t2", "t3"]
    assert [g.seed for g in queue.submitted] == [100, 101, 102, 103]
    assert sorted({t.task_id for t in batch.trajectories}) == ["t1", "t3"] and len(batch.trajectories) == 4
    assert batch.groups_dropped == 2 and len(dropped) == 2 and batch.uniform_group_fraction == 0.5
    assert batch.staleness == [0] * 4 and not queue.open  # all from the current policy, nothing left running
    assert f.batches_without_signal == 0  # t3 had signal


def test_async_replaces_a_dropped_group_and_keeps_the_batches_in_flight():
    queue = WorkQueue()
    queue.uniform = {"t1"}
    f = feed(queue, asynchronous=True, max_staleness=1, has_signal=differ)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0, count=1) or False, poll=0)
    assert sorted({t.task_id for t in batch.trajectories}) == ["t0", "t2"] and batch.groups_dropped == 1
    assert len(queue.open) == 4  # (1 + maxStaleness) batches in flight again: t3, t4 (t1's replacement), t5, t6
    state = f.state()  # the replacement is in flight, so a resumed learner submits it again
    assert ("t4", 104) in state.in_flight and state.task_cursor == 7
    nxt = f.next_batch(version=1, stop=lambda: queue.finish(version=1) or False, poll=0)
    assert nxt.groups_dropped == 0 and nxt.uniform_group_fraction == 0.0  # counted once, with its batch


def test_groups_with_equal_rewards_are_trained_without_dynamic_sampling():
    queue = WorkQueue()
    queue.uniform = {"t0", "t1"}
    f = feed(queue, asynchronous=False)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert len(batch.trajectories) == 4 and batch.groups_dropped == 0 and f.batches_without_signal == 0


def test_batches_without_signal_count_batch_sized_runs_until_a_group_with_signal():
    queue = WorkQueue()
    queue.uniform = {f"t{i}" for i in range(10)}
    f = feed(queue, asynchronous=False, has_signal=differ)
    seen = []

    def servers() -> bool:  # the learner's stop check: the breaker's limit, 3 batches without signal
        seen.append(f.batches_without_signal)
        if f.batches_without_signal >= 3:
            return True
        queue.finish(version=0, count=1)
        return False

    assert f.next_batch(version=0, stop=servers, poll=0) is None  # the wait ends: no spinning forever
    assert seen == [0, 0, 1, 1, 2, 2, 3]  # 2 groups a batch: one more batch without signal every 2 groups
    queue.uniform.clear()
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert f.batches_without_signal == 0 and batch.groups_dropped == 6  # signal again: the count starts over


def test_a_group_left_with_one_usable_member_after_its_reruns_has_no_signal():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False, has_signal=differ)
    polls = itertools.count()  # the first run and both reruns of t0 and t1 lose a sandbox
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0, error_first=next(polls) < 3) or False, poll=0)
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t0", "t1", "t0", "t1", "t2", "t3"]
    assert batch.groups_dropped == 2 and batch.failed == 0  # one member is no baseline: both dropped
    assert sorted({t.task_id for t in batch.trajectories}) == ["t2", "t3"]


# ------------------------------------------------------------------------------------ oversampling
def test_sync_oversampling_replaces_dropped_groups_from_the_same_wave():
    queue = WorkQueue()
    queue.uniform = {"t1"}
    f = feed(queue, asynchronous=False, has_signal=differ, oversampling=2.0)
    waves = []

    def servers() -> bool:
        waves.append(len(queue.open))
        queue.finish(version=0)
        return False

    batch = f.next_batch(version=0, stop=servers, poll=0)
    assert waves == [3]  # a first wave of ceil(2 x 1.25) groups: t1's drop needed no second one
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t2"]
    assert sorted({t.task_id for t in batch.trajectories}) == ["t0", "t2"]
    assert (
        batch.groups_dropped == 1 and batch.groups_surplus == 0 and batch.uniform_group_fraction == pytest.approx(1 / 3)
    )
    assert batch.drawn_solve_rate == 2 / 6 and not queue.open


def test_sync_oversampling_trains_in_submission_order_and_leaves_out_the_surplus():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False, oversampling=2.0)

    def servers_finish_the_last_groups_first() -> bool:
        queue.open.reverse()
        queue.finish(version=0, count=1)
        return False

    batch = f.next_batch(version=0, stop=servers_finish_the_last_groups_first, poll=0)
    assert [t.task_id for t in batch.trajectories] == ["t0", "t0", "t1", "t1"]  # not t2, which finished first
    assert batch.groups_surplus == 1 and batch.drawn_solve_rate == 3 / 6  # t2's episodes were drawn
    assert not queue.open and not f.ready  # the surplus is not trained a step later, off-policy


def test_sync_oversampling_draws_replacements_only_when_the_wave_cannot_fill_the_batch():
    queue = WorkQueue()
    queue.uniform = {"t0", "t1", "t2"}
    f = feed(queue, asynchronous=False, has_signal=differ, oversampling=3.0)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0, count=1) or False, poll=0)
    # t0 dropped while t1 and t2 ran: still enough. t1 dropped: one replacement (t3); t2 dropped: t4
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t2", "t3", "t4"]
    assert sorted({t.task_id for t in batch.trajectories}) == ["t3", "t4"] and batch.groups_dropped == 3


def test_sync_waves_grow_with_the_share_of_groups_without_signal_up_to_the_oversampling():
    queue = WorkQueue()
    queue.uniform = {"t0", "t1", "t2"}
    f = feed(queue, asynchronous=False, has_signal=differ, oversampling=3.0)
    f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert f.uniform_estimate == pytest.approx(0.5 * 3 / 5)  # 3 of 5 groups drawn had no signal
    drawn = len(queue.submitted)
    f.next_batch(version=1, stop=lambda: queue.finish(version=1) or False, poll=0)
    assert len(queue.submitted) - drawn == 4  # ceil(2 x 1.25 / 0.7)
    f.uniform_estimate = 0.95
    drawn = len(queue.submitted)
    f.next_batch(version=2, stop=lambda: queue.finish(version=2) or False, poll=0)
    assert len(queue.submitted) - drawn == 6  # at most oversampling x the batch


def test_async_oversampling_keeps_more_groups_in_flight():
    queue = WorkQueue()
    f = feed(queue, asynchronous=True, max_staleness=1, oversampling=1.5)
    f.next_batch(version=0, stop=lambda: queue.finish(version=0, count=2) or False, poll=0)
    assert len(queue.submitted) == 6 + 2 and len(queue.open) == 6  # ceil(2 batches x 2 groups x 1.5), refilled


def test_oversampling_below_one_is_refused():
    with pytest.raises(ValueError, match="oversampling must be at least 1"):
        feed(WorkQueue(), asynchronous=False, oversampling=0.5)


# ------------------------------------------------------------------------------------ tampering
def test_tampered_trajectories_are_counted_per_batch_trained_or_dropped():
    queue = WorkQueue()
    queue.uniform, queue.tampered = {"t0"}, {"t0", "t1"}  # t0: both members forged (all 0: dropped); t1: one
    live = []
    f = feed(queue, asynchronous=False, has_signal=differ, on_tampered=live.append)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert batch.groups_dropped == 1 and sorted({t.task_id for t in batch.trajectories}) == ["t1", "t2"]
    assert batch.tampered == 3 and live == [2, 1]  # the dropped group's forgeries count too, live and per batch
    assert [t.tampering for t in batch.trajectories if t.task_id == "t1"] == ["missing_answers", None]
    queue.tampered.clear()
    nxt = f.next_batch(version=1, stop=lambda: queue.finish(version=1) or False, poll=0)
    assert nxt.tampered == 0 and live == [2, 1]  # counted once, with its batch


def test_a_group_run_again_counts_its_tampering_for_its_last_run_only():
    queue = WorkQueue()
    queue.tampered = {"t0", "t1"}
    live = []
    f = feed(queue, asynchronous=False, on_tampered=live.append)
    polls = itertools.count()  # the first run of t0 and t1 loses a sandbox: both run again
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0, error_first=next(polls) == 0) or False, poll=0)
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t0", "t1"]
    assert batch.tampered == 2 and live == [1, 1]  # member 0 of each rerun (reward 0) forged its report


def test_without_tampering_nothing_is_counted():
    queue = WorkQueue()
    live = []
    f = feed(queue, asynchronous=True, on_tampered=live.append)
    batch = f.next_batch(version=0, stop=lambda: queue.finish(version=0) or False, poll=0)
    assert batch.tampered == 0 and not live
