"""Which sandbox servers an episode's session opens on: its image's pool on a cluster, else the job's own servers.

A task whose episode image is set (`kuberl.api.sandbox_images.episode_image`) opens its session on that image's
pool, the Service the operator keeps per image (`SANDBOX_POOL_URL` with the pool's name in it). A pool may be
scaled to zero or its pods may still start: opening a session there is retried (connection refused, 502-504)
until spec.sandbox.pools.claimTimeout, before the episode's own clock starts, and an episode that gets no
session by then fails naming the image (a failed episode is masked in training, not scored 0). Without
`SANDBOX_POOL_URL` (`kuberl run`, one machine) every task runs on the job's servers.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable
from typing import Any

import httpx

from kuberl.api import env_vars
from kuberl.api.environment import EnvironmentFailure, Task
from kuberl.api.sandbox_images import episode_image, pool_service_name
from kuberl.api.spec import SandboxSpec
from kuberl.api.types import parse_duration
from kuberl_rollout.metrics import DEFAULT_IMAGE
from kuberl_rollout.sandbox_client import SandboxClient, SandboxError

log = logging.getLogger(__name__)

CLAIM_RETRY_S = (0.5, 1.0, 2.0, 4.0, 8.0, 15.0)
"""Pauses between tries to open a session on a pool that does not answer yet, the last repeated: a pod
scaled up from zero takes seconds to minutes (the image's pull)."""
WARMING_STATUSES = frozenset({502, 503, 504})
"""Answers of a pool with no ready pod (or every pod full) behind its address: worth another try."""
POOL_CONNECT_TIMEOUT_S = 10.0
"""A pool's address that neither accepts nor refuses a connection is tried again after this long."""


class NoSandbox(EnvironmentFailure):
    """No session of the episode's image opened within the claim timeout."""


class SandboxPools:
    """The job's default servers (round robin) and a client per image's pool, created on first use."""

    def __init__(
        self,
        defaults: list[SandboxClient],
        token: str,
        job_name: str,
        sandbox: SandboxSpec,
        pool_url: str | None,
        observe_wait: Callable[[str, float], None] | None = None,
        http: httpx.AsyncClient | None = None,
        retry_s: tuple[float, ...] = CLAIM_RETRY_S,
    ) -> None:
        self._defaults = itertools.cycle(defaults)
        self.token, self.job_name, self.sandbox = token, job_name, sandbox
        self.pool_url = pool_url or None
        self.claim_timeout_s = parse_duration(sandbox.pools.claim_timeout)
        self.observe_wait = observe_wait
        """Told (image, seconds from the episode's start to its session open) for every episode."""
        self.retry_s = retry_s
        self._pools: dict[str, SandboxClient] = {}
        self._http = http  # shared by the pools' clients: one connection pool
        self._ignored_logged = False

    def image(self, task: Task) -> str:
        """The pool `task`'s episodes run on: its image, or "" for the job's servers (always "" without pools).
        ImageTemplateError for a template the task cannot fill."""
        image = episode_image(task, self.sandbox)
        if image is None:
            return DEFAULT_IMAGE
        if self.pool_url is None:
            if not self._ignored_logged:
                self._ignored_logged = True
                log.info(
                    "tasks name sandbox images (e.g. %s), ignored: without %s (per-image pools, a cluster feature) "
                    "every task runs on the job's sandbox servers",
                    image,
                    env_vars.SANDBOX_POOL_URL,
                )
            return DEFAULT_IMAGE
        return image

    def default_client(self) -> SandboxClient:
        return next(self._defaults)

    def pool_client(self, image: str) -> SandboxClient:
        """The client of `image`'s pool (one per image)."""
        client = self._pools.get(image)
        if client is None:
            assert self.pool_url is not None, "an image's pool without SANDBOX_POOL_URL"
            if self._http is None:
                self._http = httpx.AsyncClient(timeout=httpx.Timeout(660.0, connect=POOL_CONNECT_TIMEOUT_S))
            url = self.pool_url.format(pool=pool_service_name(self.job_name, image))
            # full_wait_s=0: a full pool's 503 comes back here, to wait under the claim timeout like a cold one's
            client = self._pools[image] = SandboxClient(url, self.token, http=self._http, full_wait_s=0.0)
        return client

    async def claim(
        self, task: Task, image: str, command_timeout_s: float | None, since: float
    ) -> tuple[SandboxClient, dict[str, Any]]:
        """Open a session of `task` on `image`'s pool, trying again while the pool warms up; NoSandbox once
        the claim timeout (counted from `since`, the episode's start on the perf_counter clock) has passed."""
        client = self.pool_client(image)
        deadline = since + self.claim_timeout_s
        pauses = iter(self.retry_s)
        while True:
            try:
                created = await client.create_session(task, command_timeout_s)
            except (httpx.ConnectError, httpx.ConnectTimeout, SandboxError) as err:
                if isinstance(err, SandboxError) and err.status not in WARMING_STATUSES:
                    raise
                pause = next(pauses, self.retry_s[-1])
                if time.perf_counter() + pause > deadline:
                    raise NoSandbox(
                        f"no sandbox for image {image} within {self.sandbox.pools.claim_timeout} "
                        f"(pool {client.base_url}: {str(err) or type(err).__name__})"
                    ) from err
                await asyncio.sleep(pause)
                continue
            self.opened(image, since)
            return client, created

    def opened(self, image: str, since: float) -> None:
        """An episode's session opened: its wait, for the operator's view of how fast pools answer."""
        if self.observe_wait is not None:
            self.observe_wait(image, time.perf_counter() - since)

    async def aclose(self) -> None:
        for client in self._pools.values():
            await client.aclose()
        if self._http is not None:
            await self._http.aclose()
