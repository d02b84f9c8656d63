"""The work API behind the HTTP endpoints: task groups in, finished trajectories out.

Accepted episodes wait in a bounded backlog (a full backlog answers 429: backpressure, not an unbounded
queue) and run at most `concurrent_sessions` at a time. Finished trajectories wait in an outbox that the
learner long-polls. A server that restarts gets a new `boot_id`: groups it no longer knows answer 404,
which tells the caller exactly which ones to re-submit.

The server forgets what it handed out: a group is kept while an episode of it runs or a trajectory of it waits
in the outbox; once its last trajectory has been taken (or its last episode cancelled), only its final
`GroupInfo` is kept, among the `keep_finished` most recently finished groups, and older ones answer 404 like
groups the server never ran. Memory follows the work in flight, not the server's age. The learner never asks
about a group after its trajectories arrived (it polls `/v1/trajectories`, each trajectory delivered once).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Protocol

import httpx

from kuberl.api.environment import EnvironmentFailure, RewardFunction, ScoredEnvironment, Task
from kuberl.api.rollout_http import GroupInfo, UpcomingSessions
from kuberl.api.sandbox_images import ImageTemplateError
from kuberl.api.trajectory import Trajectory
from kuberl.errors import ServiceError
from kuberl.rewards import task_problem
from kuberl_rollout.agent import Agent
from kuberl_rollout.environment_claim import Claimable, claim_environment
from kuberl_rollout.environment_close import close_environment
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.recorded_sessions import SessionStore

log = logging.getLogger(__name__)

RESTART_LOG = "weight update: episodes still running after the drain:"
"""How the log line of each drain that ran out begins (followed by the count): read by bench_async, whose
rollout servers' counters end with their processes."""


class EpisodeRunner(Protocol):
    """What plays an episode: the built-in `Agent`, or an `ExternalAgent` (spec.environment.agent)."""

    async def run(self, env: ScoredEnvironment, task: Task, group_id: str, seed: int | None = None) -> Trajectory: ...


class WorkError(ServiceError):
    """A work-API request that cannot be served."""


@dataclass
class Group:
    group_id: str
    task: Task
    size: int
    image: str = ""
    """The sandbox image its episodes run in ("" the job's default servers): the label of its metrics."""
    finished: int = 0
    failed: int = 0
    cancelled: bool = False
    episodes: list[asyncio.Task] = field(default_factory=list)
    ended: int = 0  # episodes over: finished, cancelled or crashed
    undelivered: int = 0  # trajectories in the outbox, not yet taken

    @property
    def done(self) -> bool:
        """Nothing of the group is left to run or to hand out."""
        return self.ended == self.size and self.undelivered == 0

    def describe(self) -> GroupInfo:
        return GroupInfo(
            group_id=self.group_id,
            task_id=self.task.task_id,
            size=self.size,
            finished=self.finished,
            failed=self.failed,
            running=self.size - self.finished,
            cancelled=self.cancelled,
        )


class RolloutService:
    def __init__(
        self,
        agent: Agent,
        open_environment: Callable[[], ScoredEnvironment],
        reward_fn: RewardFunction,
        tasks: dict[str, Task],
        concurrent_sessions: int,
        metrics: RolloutMetrics,
        max_backlog: int | None = None,
        keep_finished: int = 256,
    ) -> None:
        self.boot_id = uuid.uuid4().hex[:12]
        self.agent, self.tasks, self.metrics = agent, tasks, metrics
        self.runner: EpisodeRunner = agent
        """What plays the episodes: the built-in agent unless the job names an external one."""
        agent.observe = lambda phase, seconds: metrics.turn_seconds.labels(phase).observe(seconds)
        self.open_environment = open_environment
        """A new environment per episode, scored by the job's reward functions (a sandbox session, an OpenEnv
        environment...)."""
        self.reward_fn = reward_fn
        self.image_of: Callable[[Task], str] = lambda task: ""
        """The sandbox image a task's episodes run in ("" the job's default servers; `SandboxPools.image`)."""
        self.upcoming: dict[str, int] = {}
        """Episodes per task the learner announced it will submit next (`announce`), less those submitted since."""
        self._slots = asyncio.Semaphore(concurrent_sessions)
        self.max_backlog = max_backlog or 8 * concurrent_sessions
        self.groups: dict[str, Group] = {}  # groups with episodes running or trajectories not yet taken
        self.recently_done: OrderedDict[str, GroupInfo] = OrderedDict()  # the last `keep_finished` done, oldest first
        self.keep_finished = keep_finished
        self._outbox: deque[Trajectory] = deque()
        self._arrived = asyncio.Event()
        self._open_episodes = 0
        self._running = 0
        self._plays: set[asyncio.Task[Trajectory]] = set()  # the runner's play of each running episode
        self._may_start = asyncio.Event()
        self._may_start.set()
        self._idle = asyncio.Condition()

    @functools.cached_property
    def sessions(self) -> SessionStore:
        """The recorded sessions (`/v1/sessions`), external agents' included."""
        return SessionStore(self.agent.chat.tokenizer)

    def submit(self, task_id: str | None, task: Task | None, size: int, seed: int | None = None) -> Group:
        """Start `size` episodes of one task as a group."""
        if task is None:
            if task_id not in self.tasks:
                raise WorkError(404, f"unknown task {task_id!r} (this server has {len(self.tasks)} tasks)")
            task = self.tasks[task_id]
        elif problem := task_problem(self.reward_fn, task):
            raise WorkError(400, problem)
        if self._open_episodes + size > self.max_backlog:
            raise WorkError(429, f"backlog full ({self._open_episodes} episodes open, limit {self.max_backlog})")
        image = self._image(task)
        group = Group(group_id=uuid.uuid4().hex, task=task, size=size, image=image)
        self.groups[group.group_id] = group
        for i in range(size):
            episode_seed = None if seed is None else seed * 1000 + i
            group.episodes.append(asyncio.create_task(self._episode(group, episode_seed)))
        self._open_episodes += size
        self.metrics.queued.inc(size, image)
        if task.task_id in self.upcoming:  # announced, now submitted: queued, no longer upcoming
            self._announced(task, max(0, self.upcoming[task.task_id] - size), image)
        return group

    def announce(self, upcoming: list[tuple[str, int]]) -> UpcomingSessions:
        """Replace the learner's announcement of its next submissions (task id, episodes); tasks this server
        does not know (or whose image template it cannot fill) are left out. The episodes per image are
        exported for the operator's pools."""
        for task_id in list(self.upcoming):
            task = self.tasks[task_id]
            self._announced(task, 0, self._image(task))
        unknown = 0
        for task_id, episodes in upcoming:
            task = self.tasks.get(task_id)
            try:
                image = self._image(task) if task is not None else None
            except WorkError:  # its template cannot be filled: its submission will say so
                image = None
            if task is None or image is None:
                unknown += 1
                continue
            self._announced(task, self.upcoming.get(task_id, 0) + episodes, image)
        return UpcomingSessions(sessions=dict(self.metrics.upcoming.counts), unknown=unknown)

    def _announced(self, task: Task, episodes: int, image: str) -> None:
        """Set `task`'s announced episodes, and its image's gauge with them."""
        self.metrics.upcoming.inc(episodes - self.upcoming.pop(task.task_id, 0), image)
        if episodes:
            self.upcoming[task.task_id] = episodes

    def _image(self, task: Task) -> str:
        try:
            return self.image_of(task)
        except ImageTemplateError as err:
            raise WorkError(400, str(err)) from None

    def describe(self, group_id: str) -> GroupInfo:
        group = self.groups.get(group_id)
        if group is not None:
            return group.describe()
        info = self.recently_done.get(group_id)
        if info is None:
            raise WorkError(
                404,
                f"unknown group {group_id!r} (server boot {self.boot_id}: never run here, or finished and handed out "
                f"before the last {self.keep_finished}; re-submit it if its trajectories never arrived)",
            )
        return info

    def cancel(self, group_id: str) -> GroupInfo:
        group = self.groups.get(group_id)
        if group is None:  # finished (or unknown: 404): nothing left to stop
            info = self.recently_done[group_id] = self.describe(group_id).model_copy(update={"cancelled": True})
            return info
        group.cancelled = True
        for episode in group.episodes:
            episode.cancel()
        return group.describe()

    async def switch_policy(
        self, apply: Callable[[], Awaitable[None]], partial_rollouts: bool, drain_timeout_s: float | None = None
    ) -> None:
        """Run `apply` (a weight swap). With partial rollouts the swap is immediate and every token keeps the
        version that sampled it. Without them, new episodes wait and those in flight finish on the old weights
        first, so no trajectory mixes policy versions; after `drain_timeout_s` (None: no limit) those still
        running are stopped and played again from their first turn once the new weights are in."""
        if partial_rollouts:
            await apply()
            return
        self._may_start.clear()
        try:
            async with self._idle:
                try:
                    async with asyncio.timeout(drain_timeout_s):
                        await self._idle.wait_for(lambda: self._running == 0)
                except TimeoutError:
                    log.warning(
                        "%s %d (updateDrainTimeout %.1f s): stopped, to be played again on the new weights",
                        RESTART_LOG,
                        len(self._plays),
                        drain_timeout_s,
                    )
                    for play in self._plays:
                        play.cancel()
                    await self._idle.wait_for(lambda: self._running == 0)
            await apply()
        finally:
            self._may_start.set()

    async def take(self, limit: int, wait_s: float) -> list[Trajectory]:
        """Up to `limit` finished trajectories, waiting up to `wait_s` for the first (long-poll) while an episode
        is open: a server with nothing running answers at once. (The learner polls its servers one after the
        other; an idle one that held every poll for its share of the wait added 2.5 s to each step of a
        two-server job whose replacement server had no groups yet.)"""
        if not self._outbox and wait_s > 0 and self._open_episodes > 0:
            self._arrived.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation (the poll's client
            # gone) that arrives as a trajectory does, and the trajectories taken below would go nowhere
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._arrived.wait()
        out = []
        while self._outbox and len(out) < limit:
            trajectory = self._outbox.popleft()
            out.append(trajectory)
            group = self.groups[trajectory.group_id]
            group.undelivered -= 1
            self._forget_if_done(group)
        return out

    async def _episode(self, group: Group, seed: int | None) -> None:
        started = False
        try:
            async with self._slots:
                while True:
                    await self._may_start.wait()
                    if not started:
                        started = True
                        self.metrics.queued.dec(1, group.image)
                    trajectory = await self._play(group, seed)
                    if trajectory is not None:
                        break
                    self.metrics.episodes_restarted.inc()
            self._deliver(group, trajectory)
        except asyncio.CancelledError:
            if not started:
                self.metrics.queued.dec(1, group.image)
            self.metrics.trajectories.labels("cancelled").inc()
        finally:
            self._open_episodes -= 1
            group.ended += 1
            self._forget_if_done(group)

    async def _play(self, group: Group, seed: int | None) -> Trajectory | None:
        """One play of an episode; None when a weight update stopped it (switch_policy's drain timeout). It is
        an active session from the start: one that waits for its image's pool is demand the operator must see."""
        self.metrics.active_sessions.inc(1, group.image)
        try:
            env = await self._claim(group.task)
            return await self._run(env, group, seed)
        finally:
            self.metrics.active_sessions.dec(1, group.image)

    async def _claim(self, task: Task) -> ScoredEnvironment:
        """A new environment, claimed for `task` (a sandbox session of its image's pool, which may first have to
        start) before the play counts as running: a weight update does not wait for a pool to warm up, and no
        token is sampled before the claim. A failed claim is met again by the runner, which ends the episode
        as an error naming it."""
        env = self.open_environment()
        try:
            with contextlib.suppress(EnvironmentFailure, httpx.HTTPError):
                await claim_environment(env, task)
            await self._may_start.wait()  # a weight update may have begun meanwhile
        except asyncio.CancelledError:
            if isinstance(env, Claimable):  # it may hold the session it claimed
                await close_environment(env)
            raise
        return env

    async def _run(self, env: ScoredEnvironment, group: Group, seed: int | None) -> Trajectory | None:
        self._running += 1
        play = None
        try:
            play = asyncio.create_task(self.runner.run(env, group.task, group.group_id, seed))
            self._plays.add(play)
            return await play
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():  # the episode itself was cancelled (its group was)
                raise
            return None  # only the play was: its environment is closed, the episode starts again
        finally:
            self._plays.discard(play)
            self._running -= 1
            async with self._idle:
                self._idle.notify_all()

    def _deliver(self, group: Group, trajectory: Trajectory) -> None:
        group.finished += 1
        group.failed += trajectory.error is not None
        group.undelivered += 1
        self.metrics.trajectories.labels(str(trajectory.finish_reason)).inc()
        if self.runner is self.agent:  # an external agent's calls were counted as the session served them
            self.metrics.generated_tokens.inc(trajectory.generated_tokens)
        self._outbox.append(trajectory)
        self._arrived.set()

    def _forget_if_done(self, group: Group) -> None:
        """Keep only the final description of a group that is done, among the `keep_finished` latest."""
        if not group.done or self.groups.pop(group.group_id, None) is None:
            return
        self.recently_done[group.group_id] = group.describe()
        while len(self.recently_done) > self.keep_finished:
            self.recently_done.popitem(last=False)
