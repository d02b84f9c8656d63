"""Where the learner's batches come from: task groups kept in flight on the rollout servers, finished
trajectories gathered into complete groups, and the admission rule of sync and async training.

Sync: a batch's groups are submitted after the previous step's weights are published, so every
trajectory comes from the current policy. Async: enough groups stay in flight that generation never
waits for training (`maxStaleness + 1` batches); a group is admitted while its oldest token is at most
`maxStaleness` versions behind the learner, else it is dropped, counted and its task submitted again.
A group is the unit of admission because group-relative advantages need all of its members.

Dynamic sampling (`has_signal` given): a finished group whose rewards are all equal teaches a group
baseline nothing; it is dropped, counted, and the next task is submitted in its place, so a batch still
holds `groups_per_step` groups, all with signal. `batches_without_signal` counts the batch-sized runs of
such groups in a row (the NoLearningSignal breaker's input).

Oversampling (`oversampling` > 1, DAPO's generation batch larger than its training batch): more groups than
a batch are generated at once, so the groups dynamic sampling drops are replaced from the same wave instead
of by a second one (a wave costs an episode's latency; on a CPU engine 8 groups took 6 s where 4 took 5).
Sync mode sizes each wave from the fraction of groups without signal seen so far (`WAVE_MARGIN` more than
that fraction predicts, at most `oversampling` times the batch), waits for the whole wave and trains the
first `groups_per_step` groups with signal in submission order (never the ones that happened to finish
first, which would favour short episodes); the rest are surplus, counted and left out: trained a step later
they would be off-policy. A replacement is drawn only when the groups still running cannot fill the batch.
Async mode keeps `oversampling` times its batches in flight.

Tampering: a trajectory whose sandbox judged a test report forged carries the reason
(`Trajectory.tampering`, scored 0). Every finished group's such members are counted as the group finishes,
whether it is then trained, dropped for no signal or too stale, so a policy that learns to forge shows up
even when all its groups score 0 and are dropped.

Nothing is lost to a failure: the groups of a rollout server that went down or restarted are submitted
again elsewhere, and a group with a failed episode (a sandbox lost mid-trajectory) is run again, up
to `MAX_RERUNS` times, before it is trained without the failed members.

Sandbox images (`usable` given, on a cluster): a task whose image the operator found unusable is passed over
when drawn, a group of it that is to be submitted again is replaced by the next draw, and one that finished
with failed episodes is not run again: its failed members are left out like any. After each batch the tasks of
about the next step's draws are announced to the rollout servers (`announce`), which the operator reads to
warm their images' pools before the groups arrive. Not earlier: a batch's slowest episodes end minutes after
the rest, and pods warmed while they run would wait for them (benchmarks/measured/sandbox_pools.json).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kuberl.api.trajectory import Trajectory
from kuberl_trainer.rollout_client import NoRolloutServer, RolloutClient, SubmittedGroup

MAX_RERUNS = 2
# Sync oversampling: a wave holds this much more than the batch divided by the expected share of groups with
# signal, so that a batch usually fills from one wave when the share fluctuates from batch to batch.
WAVE_MARGIN = 1.25


def staleness(trajectory: Trajectory, learner_version: int) -> int:
    """How many versions behind the learner the oldest generated token of `trajectory` is."""
    return max(0, learner_version - trajectory.oldest_version)


def admissible(group: list[Trajectory], learner_version: int, max_staleness: int) -> bool:
    return all(staleness(t, learner_version) <= max_staleness for t in group)


@dataclass
class Batch:
    trajectories: list[Trajectory]  # usable (no error), grouped: members of a group are adjacent
    failed: int  # trajectories that ended with an error and were left out
    stale_dropped: int  # trajectories dropped for exceeding maxStaleness since the previous batch
    resubmitted: int  # groups submitted again since the previous batch (lost server, failed episode)
    staleness: list[int]  # per usable trajectory, at the learner version it is trained at
    wait_seconds: float
    groups_dropped: int = 0  # groups without signal (equal rewards) dropped since the previous batch
    dropped_episodes: int = 0  # usable trajectories of those groups
    dropped_solved: int = 0  # of which solved (final reward >= 1): a group of all successes is dropped too
    tampered: int = 0  # trajectories with a tampering reason, of the groups finished since the previous batch
    groups_surplus: int = 0  # sync oversampling: groups with signal generated for this batch beyond its size
    surplus_episodes: int = 0  # usable trajectories of those groups
    surplus_solved: int = 0  # of which solved

    @property
    def drawn_solve_rate(self) -> float:
        """The solve rate of every usable episode finished for this batch, trained or dropped: how well the
        policy does. The trained part alone leaves out the groups it always solves (or never does)."""
        solved = sum(t.final_reward >= 1.0 for t in self.trajectories) + self.dropped_solved + self.surplus_solved
        return solved / max(len(self.trajectories) + self.dropped_episodes + self.surplus_episodes, 1)

    @property
    def uniform_group_fraction(self) -> float:
        """Of the groups drawn for this batch (dropped, kept and surplus), the fraction dropped for equal rewards."""
        kept = len({t.group_id for t in self.trajectories}) + self.groups_surplus
        return self.groups_dropped / max(self.groups_dropped + kept, 1)


@dataclass
class FeedState:
    """What a checkpoint keeps of the feed: the task cursor, groups finished but not trained, and the
    (task, seed) of groups still in flight, which are submitted again on resume."""

    task_cursor: int = 0
    ready: list[dict] = field(default_factory=list)
    in_flight: list[tuple[str, int]] = field(default_factory=list)


class RolloutFeed:
    def __init__(
        self,
        client: RolloutClient,
        task_ids: list[str],
        group_size: int,
        groups_per_step: int,
        asynchronous: bool,
        max_staleness: int,
        seed: int,
        state: FeedState | None = None,
        on_restart: Callable[[int], None] | None = None,
        has_signal: Callable[[list[Trajectory]], bool] | None = None,
        on_drop: Callable[[], None] | None = None,
        on_tampered: Callable[[int], None] | None = None,
        oversampling: float = 1.0,
        usable: Callable[[str], bool] | None = None,
        announce: Callable[[list[tuple[str, int]]], None] | None = None,
    ) -> None:
        if not task_ids:
            raise ValueError("no tasks to train on: check spec.environment.tasks")
        if oversampling < 1.0:
            raise ValueError(f"oversampling must be at least 1, got {oversampling}")
        self.oversampling = oversampling
        self.uniform_estimate = 0.0  # sync oversampling: moving average of the share of groups without signal
        self.client, self.task_ids, self.group_size = client, task_ids, group_size
        self.groups_per_step, self.asynchronous = groups_per_step, asynchronous
        self.max_staleness = max_staleness if asynchronous else 0
        self.seed = seed
        state = state or FeedState()
        self.cursor = state.task_cursor
        self.in_flight: dict[str, SubmittedGroup] = {}
        self.received: dict[str, list[Trajectory]] = {}
        self.ready: list[list[Trajectory]] = _regroup([Trajectory.model_validate(t) for t in state.ready])
        self.orphans = 0  # trajectories of groups this learner did not submit (before a restart)
        self.on_restart = on_restart  # a server came back: it needs the current weights
        self.has_signal = has_signal  # dynamic sampling: keep a finished group only if it teaches
        self.on_drop = on_drop  # a group without signal was dropped (counted live, not per batch)
        self.on_tampered = on_tampered  # a finished group had this many tampered members (counted live)
        self.usable = usable  # whether a task's sandbox image can run (None: every task's can)
        self.announce = announce  # told the (task, episodes) of about the next step's draws
        self.uniform_in_a_row = 0  # groups without signal since the last group with signal
        self._groups_dropped = 0
        self._dropped_episodes = self._dropped_solved = 0
        self._tampered = 0
        self._stale_dropped = 0
        self._resubmitted = 0
        self._reruns: dict[tuple[str, int], int] = {}
        self._unplaced: list[tuple[str, int]] = []  # groups to submit once a server answers
        self._order: dict[str, int] = {}  # group id -> submission index (sync mode trains in this order)
        self._submitted = 0
        self._surplus = self._surplus_episodes = self._surplus_solved = 0
        for task_id, group_seed in state.in_flight:
            self._submit(task_id, group_seed)

    def next_batch(self, version: int, stop: Callable[[], bool], poll: float = 5.0) -> Batch | None:
        """The next batch for the learner at `version`; None when `stop()` became true while waiting."""
        started = time.monotonic()
        self.ready = [g for g in self.ready if self._admit(g, version)]
        self._refill()
        while len(self.ready) < self.groups_per_step or self._wave_running():
            if stop():
                return None
            collected = self.client.collect(wait=poll)
            for server in collected.lost:
                self._resubmit_from(server)
            for server in collected.restarted:
                if self.on_restart is not None:
                    self.on_restart(server)
            for trajectory in collected.trajectories:
                self._receive(trajectory, version)
            self._refill()
        if not self.asynchronous:
            self.ready.sort(key=lambda g: self._order.get(g[0].group_id, -1))
        groups, self.ready = self.ready[: self.groups_per_step], self.ready[self.groups_per_step :]
        if not self.asynchronous:
            self._leave_out_surplus()
            drawn = self._groups_dropped + len(groups) + self._surplus
            self.uniform_estimate = 0.5 * self.uniform_estimate + 0.5 * self._groups_dropped / max(drawn, 1)
        self._order = {g: i for g, i in self._order.items() if g in self.in_flight}
        usable = [t for g in groups for t in g if t.error is None]
        failed = sum(len(g) for g in groups) - len(usable)
        batch = Batch(
            usable,
            failed,
            self._stale_dropped,
            self._resubmitted,
            [staleness(t, version) for t in usable],
            time.monotonic() - started,
            self._groups_dropped,
            self._dropped_episodes,
            self._dropped_solved,
            self._tampered,
            self._surplus,
            self._surplus_episodes,
            self._surplus_solved,
        )
        self._stale_dropped = self._resubmitted = self._groups_dropped = 0
        self._dropped_episodes = self._dropped_solved = self._tampered = 0
        self._surplus = self._surplus_episodes = self._surplus_solved = 0
        if self.asynchronous:
            self._refill()  # the next batch is generated while this one trains
        if self.announce is not None:
            self.announce(self.upcoming())
        return batch

    def upcoming(self) -> list[tuple[str, int]]:
        """The (task, episodes) of the groups the next step will draw, the cursor left where it is: a sync
        step's whole wave, an async step's replacements of about a batch."""
        wave = math.ceil(self.groups_per_step * self.oversampling)
        groups = wave if self.asynchronous else self._target_in_flight()
        drawn: list[tuple[str, int]] = []
        for cursor in range(self.cursor, self.cursor + groups * len(self.task_ids)):
            if len(drawn) == groups:
                break
            task_id = self.task_ids[cursor % len(self.task_ids)]
            if self._usable(task_id):
                drawn.append((task_id, self.group_size))
        return drawn

    @property
    def batches_without_signal(self) -> int:
        """Batch-sized runs of groups without signal in a row (0 without dynamic sampling)."""
        return self.uniform_in_a_row // self.groups_per_step

    def state(self) -> FeedState:
        in_flight = [(g.task_id, g.seed) for g in self.in_flight.values()] + list(self._unplaced)
        return FeedState(
            self.cursor, [t.model_dump(mode="json", by_alias=True) for g in self.ready for t in g], in_flight
        )

    # ------------------------------------------------------------------------------------ inside
    def _target_in_flight(self) -> int:
        if self.asynchronous:
            return math.ceil((1 + self.max_staleness) * self.groups_per_step * self.oversampling)
        expected = WAVE_MARGIN / max(1.0 - self.uniform_estimate, 1e-6)
        return math.ceil(self.groups_per_step * min(self.oversampling, max(expected, 1.0)))

    def _wave_running(self) -> bool:
        """Sync mode with oversampling: groups of this batch's wave still run (or wait for a server). The
        batch is cut when the whole wave is in, so which groups are trained does not depend on finish order."""
        return not self.asynchronous and self.oversampling > 1.0 and bool(self.in_flight or self._unplaced)

    def _leave_out_surplus(self) -> None:
        """Sync mode: the wave's groups beyond the batch, counted (they were drawn) and never trained."""
        for group in self.ready:
            usable = [t for t in group if t.error is None]
            self._surplus += 1
            self._surplus_episodes += len(usable)
            self._surplus_solved += sum(t.final_reward >= 1.0 for t in usable)
        self.ready = []

    def _refill(self) -> None:
        while self._unplaced and self._place(*self._unplaced[0]):
            self._unplaced.pop(0)
        # sync: new groups only when nothing is outstanding, i.e. at the start of a batch, after the
        # weights were published
        if not self.asynchronous and (self.in_flight or self.ready or self._unplaced):
            return
        while len(self.in_flight) + len(self.ready) + len(self._unplaced) < self._target_in_flight():
            drawn = self._next_task()
            if drawn is None:
                return  # no task's image is usable: the learner stops (UnusableImages.stop)
            self.cursor += 1
            if not self._place(*drawn):
                # every server is down: the group waits for one, as the wave's groups already placed do (in
                # sync mode a wave is drawn once; a group not drawn now would never be)
                self._unplaced.append(drawn)

    def _next_task(self) -> tuple[str, int] | None:
        """The (task, seed) at the cursor: tasks in order, a seed of its own for every draw. Tasks whose image
        is unusable are passed over (the cursor moves past them); None when no task is usable."""
        for _ in range(len(self.task_ids)):
            task_id = self.task_ids[self.cursor % len(self.task_ids)]
            if self._usable(task_id):
                return task_id, self.seed + self.cursor
            self.cursor += 1
        return None

    def _usable(self, task_id: str) -> bool:
        return self.usable is None or self.usable(task_id)

    def _submit(self, task_id: str, seed: int) -> None:
        """Submit now, or as soon as a server answers (the group is never dropped). A task whose image has
        become unusable is replaced by the next draw."""
        if not self._usable(task_id):
            drawn = self._next_task()
            if drawn is None:
                return
            (task_id, seed), self.cursor = drawn, self.cursor + 1
        if not self._place(task_id, seed):
            self._unplaced.append((task_id, seed))

    def _place(self, task_id: str, seed: int) -> bool:
        try:
            group = self.client.submit(task_id, self.group_size, seed)
        except NoRolloutServer:
            return False
        self.in_flight[group.group_id] = group
        self.received[group.group_id] = []
        self._order[group.group_id] = self._submitted
        self._submitted += 1
        return True

    def _resubmit_from(self, server: int) -> None:
        """The groups of a lost server, submitted again (to the servers that answer)."""
        lost = [g for g in self.in_flight.values() if g.server == server]
        for group in lost:
            del self.in_flight[group.group_id], self.received[group.group_id]
        for group in lost:
            self._resubmitted += 1
            self._submit(group.task_id, group.seed)

    def _receive(self, trajectory: Trajectory, version: int) -> None:
        group = self.in_flight.get(trajectory.group_id)
        if group is None:
            self.orphans += 1
            return
        members = self.received[group.group_id]
        members.append(trajectory)
        if len(members) < group.size:
            return
        del self.in_flight[group.group_id], self.received[group.group_id]
        members.sort(key=lambda t: t.trajectory_id)  # arrival order varies; training must not
        key = (group.task_id, group.seed)
        failed = any(t.error is not None for t in members)
        if failed and self._reruns.get(key, 0) < MAX_RERUNS and self._usable(group.task_id):
            self._reruns[key] = self._reruns.get(key, 0) + 1  # e.g. its sandbox was lost mid-episode
            self._resubmitted += 1
            self._submit(group.task_id, group.seed)
            return
        self._count_tampered(members)
        if self._without_signal(members):
            return
        if self._admit(members, version, resubmit=(group.task_id, group.seed)):
            self.ready.append(members)

    def _count_tampered(self, group: list[Trajectory]) -> None:
        """A finished group's members whose sandbox judged a test report forged (once per group: a group
        run again is counted for its last run only)."""
        tampered = sum(t.tampering is not None for t in group)
        if tampered:
            self._tampered += tampered
            if self.on_tampered is not None:
                self.on_tampered(tampered)

    def _without_signal(self, group: list[Trajectory]) -> bool:
        """Dynamic sampling: drop a group whose usable members' rewards are all equal, and draw the next
        task in its place (now, while this batch is cut: in sync mode the weights have not moved yet). A
        group of failed episodes only is neither: it is left to the failure accounting."""
        usable = [t for t in group if t.error is None]
        if self.has_signal is None or not usable:
            return False
        if self.has_signal(usable):
            self.uniform_in_a_row = 0
            return False
        self.uniform_in_a_row += 1
        self._groups_dropped += 1
        self._dropped_episodes += len(usable)
        self._dropped_solved += sum(t.final_reward >= 1.0 for t in usable)
        if self.on_drop is not None:
            self.on_drop()
        if self.asynchronous or self._outstanding() < self.groups_per_step:
            drawn = self._next_task()
            if drawn is not None:
                self._submit(*drawn)
                self.cursor += 1
        return True

    def _outstanding(self) -> int:
        """Groups ready or on their way (running, or waiting for a server)."""
        return len(self.ready) + len(self.in_flight) + len(self._unplaced)

    def _admit(self, group: list[Trajectory], version: int, resubmit: tuple[str, int] | None = None) -> bool:
        if admissible(group, version, self.max_staleness):
            return True
        self._stale_dropped += len(group)
        task_id, seed = resubmit or (group[0].task_id, self.seed + self.cursor)
        self._submit(task_id, seed)
        return False


def _regroup(trajectories: list[Trajectory]) -> list[list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for t in trajectories:
        groups.setdefault(t.group_id, []).append(t)
    return list(groups.values())
