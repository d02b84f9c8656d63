"""Talk to sandbox servers: a thin HTTP client, and the `Environment` the rollout tier drives.

`SandboxEnvironment` implements the environment protocol over a sandbox session and scores every step
with the job's reward function, so user reward code runs in the caller's process (the rollout tier's: the
reward is computed here, not in the sandbox). `SandboxEnvironments` opens them for other parts (the
trainer's warm-up and credit probes), which get it from a composition root and never import this tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import httpx

from kuberl.api.environment import (
    EnvironmentFailure,
    RewardContext,
    RewardFunction,
    Snapshot,
    StepResult,
    Task,
    ToolCall,
)
from kuberl.api.sandbox_http import (
    MAX_COMMAND_TIMEOUT_S,
    Body,
    CreateSession,
    ExecRequest,
    ExecResponse,
    PatchRequest,
    ReplaceRequest,
    RestoreSession,
    SessionInfo,
    TestsRequest,
    WriteRequest,
)
from kuberl.rewards import EpisodeScorer
from kuberl.tokens import bearer
from kuberl_rollout.metrics import DEFAULT_IMAGE

log = logging.getLogger(__name__)

FULL_RETRY_S = (0.25, 0.5, 1.0, 2.0, 4.0)
"""Pauses between tries to open a session on a full server (503), the last repeated: a place frees up when any
episode ends, and behind a Service the next try may reach another pod."""


def _wire(body: Body) -> dict[str, Any]:
    return body.model_dump(mode="json", by_alias=True)


class SandboxError(EnvironmentFailure):
    """A sandbox server answered with an error; `status` is its HTTP status."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"sandbox answered {status}: {detail}")
        self.status = status
        self.detail = detail


class SandboxClient:
    """The HTTP API of sandbox servers behind one address. A session lives in the memory and disk of the
    server that opened it; when that server names its own endpoint (behind a load-balanced Service, its
    pod), the session's later calls go there."""

    def __init__(
        self,
        base_url: str,
        token: str,
        http: httpx.AsyncClient | None = None,
        timeout: float = 660.0,
        full_wait_s: float = 600.0,
    ):
        self.base_url = base_url.rstrip("/")
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._owns_http = http is None
        self._headers = bearer(token)
        self._endpoints: dict[str, str] = {}  # session id -> the server that holds it
        self.full_wait_s = full_wait_s
        """How long opening a session waits for a place on full servers before the 503 is raised (the
        episode's own timeout usually ends the wait first)."""
        self._cleanups: set[asyncio.Task[None]] = set()  # closes that outlive the cancelled caller that needed them

    async def aclose(self) -> None:
        if self._cleanups:  # bounded: a server that never answers must not hold up the caller's shutdown
            await asyncio.wait(set(self._cleanups), timeout=10)
        if self._owns_http:
            await self._http.aclose()

    async def _call(self, method: str, route: str, body: dict[str, Any] | None = None, /, **params: Any) -> Any:
        base = self.base_url
        if route.startswith("/v1/sessions/"):
            base = self._endpoints.get(route.split("/")[3], base)
        response = await self._http.request(
            method, base + route, json=body, params=params or None, headers=self._headers
        )
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise SandboxError(response.status_code, str(detail))
        return response.json() if response.content else None

    async def create_session(self, task: Task, timeout: float | None = None) -> dict[str, Any]:
        body = _wire(CreateSession(task=task, timeout=timeout))
        return await self._open(lambda: self._call("POST", "/v1/sessions", body))

    async def restore_session(self, task: Task, snapshot: Snapshot) -> dict[str, Any]:
        body = _wire(RestoreSession(task=task, snapshot=snapshot))
        return await self._open(lambda: self._call("POST", "/v1/sessions/restore", body))

    async def _open(self, request: Callable[[], Coroutine[Any, Any, Any]]) -> dict[str, Any]:
        """Open a session, waiting for a place while the servers are full (503) for up to `full_wait_s`."""
        waited, pauses = 0.0, iter(FULL_RETRY_S)
        while True:
            try:
                return await self._open_once(request())
            except SandboxError as err:
                pause = next(pauses, FULL_RETRY_S[-1])
                if err.status != 503 or waited + pause > self.full_wait_s:
                    raise
                if waited == 0:
                    log.info("sandbox full (%s): waiting for a place", err.detail)
                await asyncio.sleep(pause)
                waited += pause

    async def _open_once(self, request: Coroutine[Any, Any, Any]) -> dict[str, Any]:
        """One request that opens a session. A caller cancelled meanwhile (the learner cancels the groups it no
        longer needs) does not stop the server from opening it: the request runs on, and the session is closed
        as soon as its id is known, rather than held until the idle timeout. Leaked this way, a few sessions a
        step filled the demo's sandbox by step 104."""
        opening = asyncio.ensure_future(request)
        try:
            answer = await asyncio.shield(opening)
        except asyncio.CancelledError:
            self._in_background(self._close_once_open(opening))
            raise
        return self._opened(answer)

    async def _close_once_open(self, opening: asyncio.Future[Any]) -> None:
        with contextlib.suppress(SandboxError, httpx.HTTPError):
            session_id = self._opened(await opening)["sessionId"]
            await self.close(session_id)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)

    def _opened(self, answer: dict[str, Any]) -> dict[str, Any]:
        info = SessionInfo.model_validate(answer)  # the server's answer, read with the server's own model
        if info.endpoint:
            self._endpoints[info.session_id] = info.endpoint.rstrip("/")
        return answer

    async def describe(self, session_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/v1/sessions/{session_id}")

    async def execute(self, session_id: str, command: str, timeout: float | None = None) -> dict[str, Any]:
        body = ExecRequest(command=command, timeout=timeout)
        answer = await self._call("POST", f"/v1/sessions/{session_id}/exec", _wire(body))
        ExecResponse.model_validate(answer)
        return answer

    async def read_file(self, session_id: str, path: str) -> str:
        return (await self._call("GET", f"/v1/sessions/{session_id}/files", path=path))["content"]

    async def write_file(self, session_id: str, path: str, content: str) -> dict[str, Any]:
        body = WriteRequest(path=path, content=content)
        return await self._call("POST", f"/v1/sessions/{session_id}/files", _wire(body))

    async def replace(self, session_id: str, path: str, old: str, new: str) -> dict[str, Any]:
        body = ReplaceRequest(path=path, old=old, new=new)
        return await self._call("POST", f"/v1/sessions/{session_id}/files/replace", _wire(body))

    async def patch(self, session_id: str, diff: str) -> dict[str, Any]:
        return await self._call("POST", f"/v1/sessions/{session_id}/files/patch", _wire(PatchRequest(patch=diff)))

    async def list_dir(self, session_id: str, path: str = ".") -> list[dict[str, Any]]:
        return (await self._call("GET", f"/v1/sessions/{session_id}/list", path=path))["entries"]

    async def run_tests(self, session_id: str, hidden: bool = False) -> dict[str, Any]:
        return await self._call("POST", f"/v1/sessions/{session_id}/tests", _wire(TestsRequest(hidden=hidden)))

    async def step(self, session_id: str, call: ToolCall) -> StepResult:
        return StepResult.model_validate(
            await self._call("POST", f"/v1/sessions/{session_id}/step", call.to_manifest())
        )

    async def snapshot(self, session_id: str) -> Snapshot:
        return Snapshot.model_validate(await self._call("POST", f"/v1/sessions/{session_id}/snapshot"))

    async def close(self, session_id: str) -> None:
        try:
            await self._call("DELETE", f"/v1/sessions/{session_id}")
        finally:
            self._endpoints.pop(session_id, None)


class SessionPlacement(Protocol):
    """Which servers an episode's session opens on (`kuberl_rollout.sandbox_pools.SandboxPools`, which builds
    on this module's client: hence a protocol here rather than an import of it)."""

    def image(self, task: Task) -> str:
        """The pool `task`'s episodes run on, or DEFAULT_IMAGE for the job's own servers."""
        ...

    async def claim(
        self, task: Task, image: str, command_timeout_s: float | None, since: float
    ) -> tuple[SandboxClient, dict[str, Any]]:
        """Open a session of `task` on `image`'s pool; the client it is on and the created session."""
        ...

    def opened(self, image: str, since: float) -> None:
        """An episode's session opened (`since`: the episode's start on the perf_counter clock)."""
        ...


class SandboxEnvironment:
    """One agent episode in a sandbox session, scored by a reward function (the environment protocol)."""

    def __init__(
        self,
        client: SandboxClient,
        reward_fn: RewardFunction,
        intermediate_rewards: bool = False,
        process_reward: RewardFunction | None = None,
        process_weight: float = 0.0,
        session_started: Callable[[float], None] | None = None,
        command_timeout_s: float | None = None,
        pools: SessionPlacement | None = None,
    ) -> None:
        self.client = client
        # per-image pools (the rollout server's, on a cluster): a task with an image opens its session there
        self.pools = pools
        self._started = time.perf_counter()  # the episode's start: its sandbox wait counts from here
        self._claimed: dict[str, Any] | None = None
        self._claim_failure: Exception | None = None
        # told the seconds each session took to open (the rollout tier's metric; the sandbox autoscaler's input)
        self.session_started = session_started
        # the sandbox's limit of one command (its own default: 30 s): the job's turnTimeout, so that a test run
        # the turn would wait for is not cut short by the sandbox first
        self.command_timeout_s = None if command_timeout_s is None else min(command_timeout_s, MAX_COMMAND_TIMEOUT_S)
        self.scorer = EpisodeScorer(reward_fn, intermediate_rewards, process_reward, process_weight)
        self.session_id: str | None = None

    @property
    def task(self) -> Task | None:
        return self.scorer.task

    @task.setter
    def task(self, task: Task) -> None:
        self.scorer.start(task)

    @property
    def results(self) -> list[StepResult]:
        return self.scorer.results

    async def claim(self, task: Task) -> None:
        """Open the session of a task that runs on its image's pool, waiting while the pool warms up (up to the
        claim timeout: NoSandbox), before the episode's clock starts; `reset` then starts on it. A task on the
        job's default servers opens its session in `reset`."""
        if self._claim_failure is not None:  # claimed once already (by the rollout service): the same answer
            raise self._claim_failure
        if self.session_id is not None or self.pools is None or not (image := self.pools.image(task)):
            return
        try:
            self.client, self._claimed = await self.pools.claim(task, image, self.command_timeout_s, self._started)
        except (EnvironmentFailure, httpx.HTTPError) as err:
            self._claim_failure = err
            raise
        self.session_id = self._claimed["sessionId"]  # closed with the environment, whatever happens next

    async def reset(self, task: Task) -> str:
        """Open a session on `task` (or take the one `claim` opened); returns the initial observation."""
        created, self._claimed = self._claimed, None
        if created is None:
            started = time.perf_counter()
            created = await self.client.create_session(task, self.command_timeout_s)
            if self.session_started is not None:
                self.session_started(time.perf_counter() - started)
            if self.pools is not None:
                self.pools.opened(DEFAULT_IMAGE, self._started)
        self.session_id = created["sessionId"]
        self.scorer.start(task)
        return created["observation"]

    async def step(self, action: ToolCall) -> StepResult:
        """Apply an action; the result carries the final reward when done, else the intermediate reward plus the
        weighted process score (reward None when neither is enabled)."""
        return self.scorer.score(action, await self.client.step(self._session(), action))

    def final_reward(self) -> float:
        """The outcome reward of the episode so far (0 for an episode cut off before submitting)."""
        return self.scorer.final_reward()

    def resolved(self) -> bool | None:
        """Whether the episode's submission resolved the task (the sandbox's hiddenTests.resolved): False before
        a submit, None for a task without failToPass."""
        last = self.results[-1] if self.results else None
        hidden = last.info.get("hiddenTests") if last is not None and last.done else None
        if isinstance(hidden, dict) and "resolved" in hidden:
            return hidden["resolved"] is True
        return False if self.task is not None and self.task.fail_to_pass else None

    def tampering(self) -> str | None:
        """Why the sandbox judged one of the episode's test reports forged or broken (a TamperingReason value
        from `tests.tampering` of a run_tests result or `hiddenTests.tampering` of a submit), the first one in
        step order; None when none was."""
        for result in self.results:
            for key in ("tests", "hiddenTests"):
                report = result.info.get(key)
                if isinstance(report, dict) and report.get("tampering"):
                    return str(report["tampering"])
        return None

    async def snapshot(self) -> Snapshot:
        return await self.client.snapshot(self._session())

    async def restore(self, snapshot: Snapshot) -> None:
        """Continue from `snapshot` in a new session on this environment's server."""
        assert self.task is not None, "restore needs the task: call reset first or set .task"
        created = await self.client.restore_session(self.task, snapshot)
        self.session_id = created["sessionId"]

    async def close(self) -> None:
        if self.session_id is not None:
            await self.client.close(self.session_id)
            self.session_id = None

    def _session(self) -> str:
        if self.session_id is None:
            raise RuntimeError("no open session: call reset(task) first")
        return self.session_id


def _no_reward(context: RewardContext) -> None:
    return None


class SandboxEnvironments:
    """The `Environments` of one sandbox address: an environment per episode over one shared client,
    scored by `reward_fn` (by default none: demonstrations and probes need only the tokens)."""

    def __init__(self, base_url: str, token: str, reward_fn: RewardFunction = _no_reward) -> None:
        self.client = SandboxClient(base_url, token)
        self.reward_fn = reward_fn

    def open(self) -> SandboxEnvironment:
        return SandboxEnvironment(self.client, self.reward_fn)

    async def aclose(self) -> None:
        await self.client.aclose()
