"""Sandbox pools per image, the rollout tier's side: a task with an image opens its session on that image's pool
(the job's own servers for the others, and for every task without pools); a pool that warms up is tried again
until spec.sandbox.pools.claimTimeout, outside the episode's own timeouts, and an episode that got no session
by then is an error naming the image (masked in training, not scored 0); the demand the operator reads is
exported per image, the learner's announced next submissions included."""

from __future__ import annotations

import asyncio
import logging

import httpx
from fastapi.testclient import TestClient
from test_trajectory_tampering import CharTokenizer, ScriptedClient, ScriptedEngine
from test_work_api import TASKS, TOKEN, WEIGHTS, ScriptedAgent

from kuberl.api.environment import Task, ToolCall
from kuberl.api.rollout_http import UpcomingTasks
from kuberl.api.sandbox_images import pool_service_name
from kuberl.api.spec import SandboxSpec
from kuberl.api.trajectory import FinishReason
from kuberl.modeling.chat import ChatFormat
from kuberl.rewards import resolve_reward
from kuberl.tokens import bearer
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.api import RolloutState, create_app
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_rollout.sandbox_pools import SandboxPools
from kuberl_rollout.service import RolloutService
from kuberl_rollout.weights import BucketAssembler
from kuberl_sandbox.local import free_port
from kuberl_trainer.rollout_client import RolloutClient

IMAGE = "ghcr.io/acme/env-django:1"
OTHER = "ghcr.io/acme/env-flask:2"
IMAGED, PLAIN = TASKS[0].model_copy(update={"image": IMAGE}), TASKS[1]
SANDBOX = SandboxSpec.model_validate({"pools": {"claimTimeout": "1s"}})
SERVICE_ARGS = (resolve_reward("swe-toy-tests"), {}, 2, RolloutMetrics())
SESSION = {"sessionId": "s1", "taskId": IMAGED.task_id, "observation": "the task", "isolated": True}


def _no_reward(context):
    return None


async def _sessions(url: str) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(url + "/readyz")).json()["sessions"]


def test_a_task_with_an_image_opens_its_session_on_that_images_pool(sandbox, second_sandbox):
    """The job's server is `sandbox`; every image's pool is `second_sandbox` (the template has no {pool})."""

    async def play() -> tuple[list[int], list[str], list[tuple[str, float]]]:
        waits: list[tuple[str, float]] = []
        default = SandboxClient(sandbox.url, sandbox.token)
        pools = SandboxPools([default], sandbox.token, "job", SANDBOX, second_sandbox.url, lambda *w: waits.append(w))
        envs = [SandboxEnvironment(default, _no_reward, pools=pools) for _ in range(2)]
        # The servers are shared by the run's tests, so count what this test opens, not what is open.
        before = [await _sessions(sandbox.url), await _sessions(second_sandbox.url)]
        for env, task in zip(envs, (IMAGED, PLAIN), strict=True):
            await env.claim(task)
            await env.reset(task)
        after = [await _sessions(sandbox.url), await _sessions(second_sandbox.url)]
        counts = [a - b for a, b in zip(after, before, strict=True)]
        where = [env.client.base_url for env in envs]
        for env in envs:
            await env.close()
        await pools.aclose()
        await default.aclose()
        return counts, where, waits

    counts, where, waits = asyncio.run(play())
    assert counts == [1, 1]  # one session on each server
    assert where == [second_sandbox.url, sandbox.url]
    assert [image for image, _ in waits] == [IMAGE, ""] and all(seconds >= 0 for _, seconds in waits)


def test_each_image_has_one_client_for_its_pools_service():
    pools = SandboxPools([], "t", "swe-job", SANDBOX, "http://{pool}.team.svc.cluster.local:8700")
    client = pools.pool_client(IMAGE)
    assert client.base_url == f"http://{pool_service_name('swe-job', IMAGE)}.team.svc.cluster.local:8700"
    assert pools.pool_client(IMAGE) is client and pools.pool_client(OTHER) is not client
    assert (pools.image(IMAGED), pools.image(PLAIN)) == (IMAGE, "")


def test_without_pools_every_task_runs_on_the_jobs_servers_and_that_is_said_once(caplog):
    pools = SandboxPools([SandboxClient("http://default", "t")], "t", "job", SANDBOX, None)
    with caplog.at_level(logging.INFO, logger="kuberl_rollout.sandbox_pools"):
        assert [pools.image(IMAGED), pools.image(IMAGED), pools.image(PLAIN)] == ["", "", ""]
    assert len([r for r in caplog.records if IMAGE in r.getMessage()]) == 1


async def test_a_pool_that_warms_up_is_tried_again_until_it_opens_a_session():
    """Nothing listens yet (refused twice), then every pod is busy starting (503), then a session opens."""
    answers = ["refused", "refused", 503, 201]
    seen: list[str] = []

    def pool(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        answer = answers.pop(0)
        if answer == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if answer == 503:
            return httpx.Response(503, json={"detail": "no ready pod"})
        return httpx.Response(201, json=SESSION)

    waits: list[tuple[str, float]] = []
    async with httpx.AsyncClient(transport=httpx.MockTransport(pool)) as http:
        pools = SandboxPools(
            [], "t", "job", SANDBOX, "http://{pool}:8700", lambda *w: waits.append(w), http=http, retry_s=(0.01,)
        )
        env = SandboxEnvironment(ScriptedClient([]), _no_reward, pools=pools)
        await env.claim(IMAGED)
        assert await env.reset(IMAGED) == "the task"
    assert answers == [] and set(seen) == {pool_service_name("job", IMAGE)}
    assert env.session_id == "s1" and [image for image, _ in waits] == [IMAGE]


async def test_an_episode_with_no_sandbox_within_the_claim_timeout_is_an_error_naming_the_image():
    """The claim timeout (1 s) is longer than a turn's (0.1 s): the wait is not the episode's time, and it ends
    as an error (masked in training), not a timeout (scored 0)."""
    pools = SandboxPools([], "t", "job", SANDBOX, f"http://127.0.0.1:{free_port()}", retry_s=(0.1,))
    agent = Agent(
        ScriptedEngine([ToolCall(name="submit")]),
        ChatFormat(CharTokenizer()),
        "fix it",
        EpisodeLimits(max_tokens=100_000, max_tokens_per_turn=1000, turn_timeout_s=0.1),
    )
    env = SandboxEnvironment(ScriptedClient([]), lambda ctx: 1.0, pools=pools)
    trajectory = await agent.run(env, IMAGED, group_id="g1")
    assert trajectory.finish_reason == FinishReason.ERROR and trajectory.final_reward == 0.0
    assert f"no sandbox for image {IMAGE} within 1s" in trajectory.error

    # through the server: it claims before the play and the agent meets the same failure, not a second wait
    service = RolloutService(agent, lambda: SandboxEnvironment(None, lambda ctx: 1.0, pools=pools), *SERVICE_ARGS)
    service.image_of = pools.image
    claims, claim = [], pools.claim
    pools.claim = lambda *args: claims.append(args[1]) or claim(*args)
    service.submit(None, IMAGED, 1)
    [served] = await service.take(1, wait_s=10)
    await pools.aclose()
    assert served.finish_reason == FinishReason.ERROR and f"no sandbox for image {IMAGE}" in served.error
    assert claims == [IMAGE]


# ------------------------------------------------------------------------------------- demand by image
def _service() -> RolloutService:
    service = RolloutService(
        ScriptedAgent(), object, resolve_reward("swe-toy-tests"), {t.task_id: t for t in TASKS}, 8, RolloutMetrics()
    )
    service.image_of = lambda task: IMAGE if task.task_id == TASKS[2].task_id else ""
    return service


def _sample(service: RolloutService, name: str, image: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, {"image": image})


async def test_running_queued_and_upcoming_episodes_are_counted_by_image():
    service = _service()
    slow: Task = TASKS[2]  # the scripted agent holds its episodes until released; its image is IMAGE
    answer = service.announce([(slow.task_id, 4), (TASKS[0].task_id, 2), ("no-such-task", 3)])
    assert (answer.sessions, answer.unknown) == ({"": 2, IMAGE: 4}, 1)
    assert _sample(service, "kuberl_rollout_upcoming_sessions", IMAGE) == 4

    service.submit(slow.task_id, None, 3)
    assert _sample(service, "kuberl_rollout_queued_trajectories", IMAGE) == 3
    assert _sample(service, "kuberl_rollout_upcoming_sessions", IMAGE) == 1  # submitted: no longer upcoming
    await asyncio.sleep(0.05)
    assert _sample(service, "kuberl_rollout_active_sessions", IMAGE) == 3
    assert _sample(service, "kuberl_rollout_queued_trajectories", IMAGE) is None  # an image at 0 leaves the scrape
    assert _sample(service, "kuberl_rollout_active_sessions", "") == 0  # the default's stays, at 0

    service.announce([])  # the next announcement replaces the previous one
    assert _sample(service, "kuberl_rollout_upcoming_sessions", IMAGE) is None
    assert _sample(service, "kuberl_rollout_upcoming_sessions", "") == 0
    service.agent.release.set()
    assert len(await service.take(8, wait_s=5)) >= 1
    while service._open_episodes:
        await asyncio.sleep(0.01)
    assert _sample(service, "kuberl_rollout_active_sessions", IMAGE) is None


def test_the_learner_announces_over_http_with_the_job_token():
    made: dict[str, RolloutService] = {}

    async def build_state() -> RolloutState:
        service = made["service"] = _service()
        return RolloutState(service, service.metrics, "tiny", "wait", BucketAssembler(WEIGHTS), 4096)

    body = UpcomingTasks.model_validate({"tasks": [{"taskId": TASKS[2].task_id, "episodes": 8}]}).wire()
    with TestClient(create_app(build_state, TOKEN), base_url="http://rollout") as http:
        assert http.post("/v1/upcoming", json=body).status_code == 401
        answer = http.post("/v1/upcoming", json=body, headers=bearer(TOKEN))
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"sessions": {"": 0, IMAGE: 8}, "unknown": 0}
        none = {"tasks": [{"taskId": "t", "episodes": 0}]}
        assert http.post("/v1/upcoming", json=none, headers=bearer(TOKEN)).status_code == 422
        text = http.get("/metrics").text
    assert f'kuberl_rollout_upcoming_sessions{{image="{IMAGE}"}} 8.0' in text
    assert 'kuberl_rollout_active_sessions{image=""} 0.0' in text
    assert "kuberl_rollout_sandbox_wait_seconds_bucket" in text


async def test_an_episode_waiting_for_its_pool_is_demand_but_holds_up_no_weight_update():
    """Without partial rollouts a weight update waits for the episodes that sample; one still waiting for its
    sandbox has sampled nothing, and a pool's warm-up (minutes: the image's pull) must not stall training."""
    released = asyncio.Event()

    async def cold_pool(request: httpx.Request) -> httpx.Response:
        await released.wait()
        return httpx.Response(201, json=SESSION)

    async with httpx.AsyncClient(transport=httpx.MockTransport(cold_pool)) as http:
        pools = SandboxPools([], "t", "job", SANDBOX, "http://{pool}:8700", http=http)
        service = _service()
        service.open_environment = lambda: SandboxEnvironment(ScriptedClient([]), _no_reward, pools=pools)
        service.image_of = pools.image
        service.submit(None, IMAGED, 1)
        await asyncio.sleep(0.05)
        assert _sample(service, "kuberl_rollout_active_sessions", IMAGE) == 1  # the operator sees it
        applied: list[int] = []

        async def apply() -> None:
            applied.append(1)

        await asyncio.wait_for(service.switch_policy(apply, partial_rollouts=False), timeout=5)
        assert applied == [1]
        released.set()
        [trajectory] = await service.take(8, wait_s=5)
    assert trajectory.error is None


def test_the_learners_client_announces_what_the_server_counts_by_image():
    made: dict[str, RolloutService] = {}

    async def build_state() -> RolloutState:
        service = made["service"] = _service()
        return RolloutState(service, service.metrics, "tiny", "wait", BucketAssembler(WEIGHTS), 4096)

    with TestClient(create_app(build_state, TOKEN), base_url="http://rollout", headers=bearer(TOKEN)) as http:
        client = RolloutClient(["http://rollout"], TOKEN)
        client.http[0].close()
        client.http = [http]
        client.announce([(TASKS[2].task_id, 4), (TASKS[0].task_id, 4), (TASKS[2].task_id, 4)])
        assert made["service"].metrics.upcoming.counts == {"": 4, IMAGE: 8}
        assert client.without_upcoming == set()
