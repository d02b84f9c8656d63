"""The work API without vLLM: the learner's client against the rollout server's app (a scripted agent in place
of the engine and the sandbox), the same `kuberl.api.rollout_http` models on both sides and today's JSON keys
on the wire; and the service's memory of groups bounded however many it ran."""

from __future__ import annotations

import asyncio
import gc
import json
import time
import weakref
from pathlib import Path

import httpx
import pytest
import torch
from fastapi.testclient import TestClient
from safetensors.torch import save

from kuberl.api.environment import Task
from kuberl.api.rollout_http import SubmitGroup, TrajectoryQuery
from kuberl.api.trajectory import Trajectory
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl.tokens import bearer, new_token
from kuberl_rollout.api import RolloutState, create_app
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.service import RolloutService, WorkError
from kuberl_rollout.weights import BucketAssembler
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.weight_transport import StoredWeights

TASKS = generate(3, seed=5)
SLOW = TASKS[2]  # its episodes wait until the test lets them finish
WEIGHTS = {"w": (2, 3)}
TOKEN = new_token()


class FakeEngine:
    dead = False

    def __init__(self) -> None:
        self.version = 0
        self.applied: list[bytes] = []

    async def update_weights(self, files: list[Path], version: int, mode: str) -> None:
        self.applied = [f.read_bytes() for f in files]  # the staged files exist while the engine reads them
        self.version = version


class ScriptedAgent:
    """Finishes an episode at once with a one-token trajectory; seed 13's first episode fails; episodes of the
    SLOW task wait for `release`."""

    def __init__(self) -> None:
        self.engine = FakeEngine()
        self.observe = None
        self.release = asyncio.Event()

    async def run(self, env, task: Task, group_id: str, seed: int | None = None) -> Trajectory:
        await (self.release.wait() if task.task_id == SLOW.task_id else asyncio.sleep(0))
        version = self.engine.version
        return Trajectory(
            trajectory_id=f"{group_id}-{seed}",
            task_id=task.task_id,
            group_id=group_id,
            token_ids=[1, 2],
            loss_mask=[0, 1],
            logprobs=[0.0, -0.5],
            policy_versions=[-1, version],
            prompt_length=1,
            final_reward=1.0,
            finish_reason="error" if seed == 13_000 else "submitted",
            error="sandbox failed: scripted" if seed == 13_000 else None,
        )


def service(keep_finished: int = 256) -> RolloutService:
    return RolloutService(
        ScriptedAgent(),
        object,  # the scripted agent plays in no environment
        resolve_reward("swe-toy-tests"),
        {t.task_id: t for t in TASKS},
        concurrent_sessions=8,
        metrics=RolloutMetrics(),
        max_backlog=64,
        keep_finished=keep_finished,
    )


# ------------------------------------------------------------------------------------------ the leak
async def test_the_service_forgets_groups_once_their_trajectories_are_handed_out():
    rollout = service(keep_finished=16)
    held, taken, first_ids, first = [], 0, [], []
    for batch in range(50):  # 500 groups of 2 episodes, 10 at a time, like a learner's steps
        ids = [rollout.submit(TASKS[i % 2].task_id, None, 2, seed=batch * 10 + i).group_id for i in range(10)]
        if batch == 0:
            first_ids, first = ids, [weakref.ref(rollout.groups[g]) for g in ids]
        while taken < 20 * (batch + 1):
            taken += len(await rollout.take(8, wait_s=5))
            held.append(len(rollout.groups) + len(rollout.recently_done))
    assert taken == 1000 and not rollout._outbox and rollout._open_episodes == 0
    assert rollout.groups == {} and len(rollout.recently_done) == 16
    assert max(held) <= 10 + 16  # the groups of one batch in flight, and the recent ones: not 500
    gc.collect()
    assert [ref() for ref in first] == [None] * 10  # nothing else (an episode task, a closure) holds them
    last = rollout.describe(ids[-1])  # the recent ones are still described
    assert (last.finished, last.running, last.cancelled) == (2, 0, False)
    with pytest.raises(WorkError, match="re-submit") as forgotten:
        rollout.describe(first_ids[0])
    assert forgotten.value.status == 404


async def test_a_group_stays_until_its_last_trajectory_is_taken():
    rollout = service()
    group = rollout.submit(TASKS[0].task_id, None, 3, seed=1)
    while rollout._open_episodes:
        await asyncio.sleep(0)
    assert rollout.groups == {group.group_id: group}  # all episodes ended, nothing handed out yet
    assert len(await rollout.take(2, wait_s=0)) == 2 and group.group_id in rollout.groups
    assert len(await rollout.take(2, wait_s=0)) == 1 and rollout.groups == {}
    assert rollout.describe(group.group_id).finished == 3


async def test_a_server_with_no_episode_open_answers_a_long_poll_at_once():
    rollout = service()
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await rollout.take(8, wait_s=30) == []  # nothing can arrive: no waiting for it
    assert loop.time() - started < 1.0
    group = rollout.submit(SLOW.task_id, None, 1, seed=4)
    waiting = asyncio.create_task(rollout.take(8, wait_s=30))
    await asyncio.sleep(0.2)
    assert not waiting.done()  # an episode is open: the poll waits for it
    rollout.agent.release.set()
    assert [t.group_id for t in await asyncio.wait_for(waiting, 5)] == [group.group_id]


async def test_a_cancelled_group_is_forgotten_when_its_episodes_end():
    rollout = service()
    group = rollout.submit(SLOW.task_id, None, 2, seed=3)
    await asyncio.sleep(0)
    info = rollout.cancel(group.group_id)
    assert info.cancelled and info.running == 2
    while rollout._open_episodes:
        await asyncio.sleep(0)
    assert rollout.groups == {} and await rollout.take(8, wait_s=0) == []
    assert rollout.describe(group.group_id).cancelled
    assert rollout.cancel(group.group_id).cancelled  # cancelling a finished group again is harmless


# ----------------------------------------------------------------------------------- over HTTP, typed
@pytest.fixture
def rollout(request):
    """(the learner's client, the HTTP client under it, the service, the JSON bodies sent and answered); an
    indirect parameter is the server's rollout.updateDrainTimeout in seconds."""
    made: dict[str, RolloutService] = {}

    async def build_state() -> RolloutState:
        made["service"] = service()
        return RolloutState(
            made["service"],
            made["service"].metrics,
            "tiny",
            "wait",
            BucketAssembler(WEIGHTS),
            4096,
            drain_timeout_s=getattr(request, "param", None),
        )

    wire: list[tuple[str, str, dict | None, dict]] = []

    def record(response: httpx.Response) -> None:
        response.read()
        sent = json.loads(response.request.content) if response.request.method == "POST" else None
        wire.append((response.request.method, response.request.url.path, sent, response.json()))

    with TestClient(create_app(build_state, TOKEN), base_url="http://rollout", headers=bearer(TOKEN)) as http:
        http.event_hooks["response"].append(record)
        client = RolloutClient(["http://rollout"], TOKEN)
        client.http[0].close()
        client.http = [http]
        yield client, http, made["service"], wire


def collect(client: RolloutClient, count: int) -> list[Trajectory]:
    found: list[Trajectory] = []
    for _ in range(50):
        found += client.collect(wait=1).trajectories
        if len(found) >= count:
            return found
    raise AssertionError(f"only {len(found)} of {count} trajectories")


def test_the_learners_client_drives_the_app_with_the_same_models(rollout):
    client, _, service, wire = rollout
    named = client.submit(TASKS[0].task_id, 2, seed=13)
    inline = client.submit_task(TASKS[1], 3, seed=4)
    trajectories = collect(client, 5)
    assert sorted(t.group_id for t in trajectories) == sorted([named.group_id] * 2 + [inline.group_id] * 3)
    assert [t.error is not None for t in trajectories if t.group_id == named.group_id].count(True) == 1
    assert client.boot_ids == [service.boot_id] and service.groups == {}
    assert client.served_versions() == [0]
    weights = save({"w": torch.zeros(WEIGHTS["w"])})
    assert client.publish(1, [weights]) == [0]
    assert service.agent.engine.applied == [weights]  # the bytes sent, staged as they are
    assert client.served_versions() == [1] and client.catch_up(0, 1, []) is True
    # today's JSON keys, in today's order, on both sides
    sent = {(method, path): (body, answer) for method, path, body, answer in wire}
    body, answer = sent["POST", "/v1/groups"]  # the last one: the inline task
    assert body == {"task": TASKS[1].to_manifest(), "groupSize": 3, "seed": 4} and list(body) == [
        "task",
        "groupSize",
        "seed",
    ]
    assert wire[0][2] == {"taskId": TASKS[0].task_id, "groupSize": 2, "seed": 13}
    assert list(answer) == [
        *("groupId", "taskId", "size", "finished", "failed", "running", "cancelled"),
        *("bootId", "policyVersion"),
    ]
    assert list(sent["GET", "/v1/trajectories"][1]) == ["bootId", "trajectories"]
    assert list(sent["GET", "/v1/policy"][1]) == ["version", "bootId"]
    assert sent["PUT", "/v1/weights/1/buckets/0"][1] == {"version": 1, "received": 1, "of": 1, "applied": True}


@pytest.mark.parametrize("rollout", [0.2], indirect=True)
def test_a_weight_update_over_http_waits_no_longer_than_the_drain_timeout(rollout):
    client, http, service, _ = rollout
    group = client.submit(SLOW.task_id, 1, seed=3)  # its episode runs until released
    started = time.monotonic()
    assert client.publish(1, [save({"w": torch.ones(WEIGHTS["w"])})]) == [0]
    assert time.monotonic() - started < 5 and service.agent.engine.version == 1
    assert service.metrics.episodes_restarted._value.get() == 1  # stopped, and playing again on version 1
    http.portal.call(service.agent.release.set)  # in the app's event loop
    [again] = collect(client, 1)
    assert again.group_id == group.group_id and again.policy_versions == [-1, 1]


def test_stored_weights_are_written_once_and_each_server_loads_them_from_storage(rollout, tmp_path):
    """The learner writes a version's buckets under the storage prefix once; the server checks and loads them
    from there (POST /v1/weights/load); only the latest two versions stay in storage."""
    client, _, service, wire = rollout
    client.transport = StoredWeights(str(tmp_path / "weights"))
    versions = [save({"w": torch.full(WEIGHTS["w"], float(v))}) for v in range(4)]
    for version in (1, 2, 3):
        assert client.publish(version, [versions[version]]) == [0]
        assert service.agent.engine.version == version and service.agent.engine.applied == [versions[version]]
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["v00000002", "v00000003"]
    assert wire[-1][2] == {"uri": f"{tmp_path}/weights/v00000003", "version": 3}
    wrong = tmp_path / "weights" / "v00000004"  # a stored version whose tensor has the wrong shape
    wrong.mkdir()
    (wrong / "model-00001-of-00001.safetensors").write_bytes(save({"w": torch.zeros(3)}))
    refused = client.http[0].post("/v1/weights/load", json={"uri": str(wrong), "version": 4})
    assert refused.status_code == 400 and "'w' has shape [3], expected [2, 3]" in refused.json()["detail"]
    assert service.agent.engine.version == 3


def test_the_requests_are_the_ones_sent_before_the_models():
    assert SubmitGroup(task_id="t", group_size=2, seed=7).wire() == {"taskId": "t", "groupSize": 2, "seed": 7}
    assert TrajectoryQuery(wait=2.5, limit=1024).wire() == {"wait": 2.5, "limit": 1024}
    with pytest.raises(ValueError, match="exactly one of taskId or task"):
        SubmitGroup(group_size=2)  # refused by the client before it is sent, as by the server


BAD = [
    ("POST", "/v1/groups", {"groupSize": 2}, 422, "exactly one of taskId or task"),
    ("POST", "/v1/groups", {"taskId": TASKS[0].task_id, "groupSize": 1, "priority": 3}, 422, "priority"),
    ("POST", "/v1/groups", {"taskId": "nope", "groupSize": 1}, 404, "unknown task 'nope'"),
    ("GET", "/v1/groups/nope", None, 404, "unknown group 'nope'"),
    ("DELETE", "/v1/groups/nope", None, 404, "re-submit"),
    ("GET", "/v1/trajectories?limit=0", None, 422, "limit"),
    ("PUT", "/v1/weights/2/buckets/0", None, 422, "query.of"),
    ("POST", "/v1/weights/load", {"uri": "/tmp", "version": 0}, 422, "version"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), BAD, ids=[f"{b[0]} {b[1]} {b[3]}" for b in BAD])
def test_bad_requests_get_a_problem_naming_it(rollout, method, path, body, status, words):
    response = rollout[1].request(method, path, json=body)
    assert response.status_code == status, response.text
    assert list(response.json()) == ["detail"] and words in response.json()["detail"]


def test_a_group_is_described_while_it_runs_and_after(rollout):
    client, http, service, _ = rollout
    group = client.submit(SLOW.task_id, 2, seed=1)
    running = http.get(f"/v1/groups/{group.group_id}").json()
    assert (running["running"], running["finished"]) == (2, 0)
    http.portal.call(service.agent.release.set)
    assert len(collect(client, 2)) == 2
    done = http.get(f"/v1/groups/{group.group_id}").json()
    assert (done["running"], done["finished"]) == (0, 2) and service.groups == {}
