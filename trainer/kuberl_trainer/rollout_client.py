"""The learner's side of the rollout servers' work API: submit task groups, collect finished
trajectories, publish weights. Groups go round robin over the servers that answer.

Servers come and go (a crash, a spot preemption, a replacement): a server that does not answer is
marked down and skipped; one that answers with a new boot id has restarted, lost its groups and
serves its initial weights. `collect` reports both, so the caller can re-submit that server's groups
and send it the current weights.

Requests and answers are the models of `kuberl.api.rollout_http`, the ones the server declares; every request
presents the job token (`kuberl.tokens`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx

from kuberl.api.environment import Task
from kuberl.api.rollout_http import (
    MAX_UPCOMING_TASKS,
    AcceptedGroup,
    Policy,
    SubmitGroup,
    Trajectories,
    TrajectoryQuery,
    UpcomingTask,
    UpcomingTasks,
)
from kuberl.api.trajectory import Trajectory
from kuberl.tokens import bearer
from kuberl_trainer.weight_transport import HttpBuckets, WeightTransport

log = logging.getLogger(__name__)
MIN_EMPTY_COLLECT_S = 0.2
"""A collect that found nothing lasts at least this long: servers with no episode open answer at once (they
have nothing to wait for), and a caller looping on collect must not spin."""


class NoRolloutServer(RuntimeError):
    """No rollout server answered."""


@dataclass(frozen=True)
class SubmittedGroup:
    group_id: str
    task_id: str
    seed: int
    size: int
    server: int


@dataclass
class Collected:
    trajectories: list[Trajectory] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)  # servers that went down or restarted: their groups are gone
    restarted: list[int] = field(default_factory=list)  # servers back with a new boot id (initial weights)


class RolloutClient:
    def __init__(
        self, urls: list[str], token: str, timeout: float = 600.0, transport: WeightTransport | None = None
    ) -> None:
        if not urls:
            raise ValueError("the learner needs at least one rollout server URL (--rollout-url)")
        self.urls = urls
        self.transport = transport or HttpBuckets()
        self.http = [
            httpx.Client(base_url=u, headers=bearer(token), timeout=httpx.Timeout(timeout, connect=5.0)) for u in urls
        ]
        self.boot_ids: list[str | None] = [None] * len(urls)
        self.down: set[int] = set()
        self._lost: list[int] = []  # servers seen going down since the last collect, by whichever call saw it
        self.without_upcoming: set[int] = set()  # servers that do not know `POST /v1/upcoming` (older ones)
        self._turn = 0

    def submit(self, task_id: str, size: int, seed: int) -> SubmittedGroup:
        """Start a group on the next server that accepts it."""
        return self._submit(SubmitGroup(task_id=task_id, group_size=size, seed=seed), task_id, seed)

    def submit_task(self, task: Task, size: int, seed: int) -> SubmittedGroup:
        """Start a group of an inline task, one the servers need not know (evaluation on a held-out split)."""
        return self._submit(SubmitGroup(task=task, group_size=size, seed=seed), task.task_id, seed)

    def _submit(self, body: SubmitGroup, task_id: str, seed: int) -> SubmittedGroup:
        for _ in range(len(self.http)):
            server, self._turn = self._turn, (self._turn + 1) % len(self.http)
            if server in self.down:
                continue
            try:
                r = self.http[server].post("/v1/groups", json=body.wire())
                r.raise_for_status()
            except httpx.TransportError as err:
                self._mark_down(server, err)
                continue
            accepted = AcceptedGroup.model_validate_json(r.content)
            return SubmittedGroup(accepted.group_id, task_id, seed, body.group_size, server)
        raise NoRolloutServer(f"no rollout server accepts work ({len(self.down)} of {len(self.http)} down)")

    def announce(self, upcoming: list[tuple[str, int]]) -> None:
        """Tell the servers the (task, episodes) of the next submissions, split among them as the groups will
        be, each part replacing that server's previous announcement; they export the episodes per sandbox image
        for the operator to warm their pools. Best effort: a server that fails is skipped, one that does not
        know the route is not asked again."""
        servers = [s for s in range(len(self.http)) if s not in self.down and s not in self.without_upcoming]
        for i, server in enumerate(servers):
            part = [UpcomingTask(task_id=t, episodes=n) for t, n in upcoming[i :: len(servers)][:MAX_UPCOMING_TASKS]]
            try:
                r = self.http[server].post("/v1/upcoming", json=UpcomingTasks(tasks=part).wire())
            except httpx.TransportError as err:
                log.debug("announcing to %s failed (%s)", self.urls[server], err)
                continue
            if r.status_code in (404, 405):
                log.info("rollout server %s takes no announcements of upcoming tasks", self.urls[server])
                self.without_upcoming.add(server)
            elif r.status_code >= 400:
                log.debug("announcing to %s: %s %s", self.urls[server], r.status_code, r.text[:200])

    def collect(self, wait: float) -> Collected:
        """Finished trajectories from every server (long-polling each up to `wait` / servers seconds), and
        which servers were lost or came back since the last call."""
        out = Collected()
        started = time.monotonic()
        query = TrajectoryQuery(wait=wait / len(self.http), limit=1024).wire()
        for server, http in enumerate(self.http):
            try:
                body = Trajectories.model_validate_json(
                    http.get("/v1/trajectories", params=query).raise_for_status().content
                )
            except (httpx.TransportError, httpx.HTTPStatusError) as err:
                self._mark_down(server, err)
                continue
            previous = self.boot_ids[server]
            self.boot_ids[server] = body.boot_id
            rebooted = previous is not None and previous != body.boot_id
            if rebooted or server in self.down:
                out.restarted.append(server)  # it may lack the current weights
                if rebooted and server not in self.down and server not in self._lost:
                    self._lost.append(server)  # restarted between two polls: its groups are gone too
            self.down.discard(server)
            out.trajectories += body.trajectories
        # a server first found down by a submission or a weight update lost its groups as surely as one found
        # down here: reported once, whichever call saw it go
        out.lost, self._lost = self._lost, []
        if not out.trajectories:
            time.sleep(max(0.0, min(wait, MIN_EMPTY_COLLECT_S) - (time.monotonic() - started)))
        return out

    def publish(self, version: int, buckets: list[bytes], servers: list[int] | None = None) -> list[int]:
        """Send the weights of `version` (its safetensors buckets) to the servers (all by default) through the
        transport; returns those that took them. A server that is down gets them when it comes back."""
        took = []
        for server in range(len(self.http)) if servers is None else servers:
            try:
                self.transport.send(self.http[server], version, buckets)
            except httpx.TransportError as err:
                self._mark_down(server, err)
                continue
            took.append(server)
        return took

    def catch_up(self, server: int, version: int, buckets: list[bytes]) -> bool:
        """Send `version` to one server unless it already serves it (or newer); True when it has it now."""
        try:
            served = self._policy(self.http[server]).version
        except httpx.TransportError as err:
            self._mark_down(server, err)
            return False
        return served >= version or bool(self.publish(version, buckets, [server]))

    def served_versions(self) -> list[int]:
        versions = []
        for server, http in enumerate(self.http):
            try:
                versions.append(self._policy(http).version)
            except httpx.TransportError as err:
                self._mark_down(server, err)
        return versions or [0]

    @staticmethod
    def _policy(http: httpx.Client) -> Policy:
        return Policy.model_validate_json(http.get("/v1/policy").raise_for_status().content)

    def close(self) -> None:
        for http in self.http:
            http.close()

    def _mark_down(self, server: int, err: Exception) -> None:
        if server not in self.down:
            log.warning("rollout server %s is down (%s)", self.urls[server], err)
            self._lost.append(server)
        self.down.add(server)
