"""One pass over a job's image pools (pool_reconcile.reconcile_pools) on an in-memory API: which objects it
writes and deletes, and when it asks nothing at all. Time is the `clock` argument."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import pool_key, pool_service_name
from kuberl.kube import object_path
from kuberl_operator.images import JobImages
from kuberl_operator.pool_reconcile import (
    POOL_DELETE_AFTER_S,
    PoolsMemory,
    reconcile_pools,
    scale_pools_to_zero,
)
from kuberl_operator.pools import ImageDemand
from kuberl_operator.sandbox_pools import AGENT_SANDBOX_API, TEMPLATE_DIGEST_ANNOTATION, pool_objects
from kuberl_operator.security import SandboxPodSecurity

NS, UID = "rl", "00000000-0000-4000-8000-000000000000"
IMAGE = "registry.example.com/swe/a:1"
BODY = {"metadata": {"name": "swe", "namespace": NS, "uid": UID}}
SECURITY, IMAGES = SandboxPodSecurity(), JobImages(registry="registry.example.com/kuberl", tag="1.0.0")


class MemoryApi:
    """The few calls pool_reconcile makes, on a dict of objects by path; `served` lists the agent-sandbox kinds."""

    def __init__(self, agent_sandbox: bool = False) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.agent_sandbox = agent_sandbox

    def get(self, path: str) -> dict[str, Any] | None:
        self.requests.append(("get", path))
        if path == f"/apis/{AGENT_SANDBOX_API}":
            names = ["sandboxtemplates", "sandboxwarmpools"] if self.agent_sandbox else []
            return {"resources": [{"name": n} for n in names]} if self.agent_sandbox else None
        return self.objects.get(path)

    def list(self, path: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        self.requests.append(("list", path))
        return [
            {k: v for k, v in o.items() if k not in ("apiVersion", "kind")}  # as a list's items may come
            for p, o in self.objects.items()
            if p.rsplit("/", 1)[0] == path and selector.items() <= o["metadata"]["labels"].items()
        ]

    def apply(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        self.requests.append(("apply", object_path(obj)))
        self.objects[object_path(obj)] = obj
        return obj

    def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append(("patch", path))
        self.objects[path]["spec"].update(body["spec"])
        return self.objects[path]

    def delete(self, path: str) -> bool:
        self.requests.append(("delete", path))
        return self.objects.pop(path, None) is not None

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects.values())


def job(**pools: Any) -> RLJob:
    return RLJob.from_manifest(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "swe", "namespace": NS},
            "spec": {
                "model": {"uri": "s3://models/tiny"},
                "sandbox": {"maxReplicas": 8, "sessionsPerPod": 2, "pools": {"idleTimeout": "1m", **pools}},
            },
        }
    )


def run(api: MemoryApi, j: RLJob, memory: PoolsMemory, clock: float, demand=None, pods=(), stored=()):
    return reconcile_pools(
        api,
        BODY,
        j,
        list(pods),
        demand,
        memory,
        clock,
        1,
        list(stored),
        SECURITY,
        IMAGES,  # type: ignore[arg-type]
    )


def deployment(api: MemoryApi) -> dict[str, Any] | None:
    return api.objects.get(f"/apis/apps/v1/namespaces/{NS}/deployments/{pool_service_name('swe', IMAGE)}")


def test_a_job_on_its_default_pool_only_lists_once_then_asks_nothing():
    api, memory = MemoryApi(), PoolsMemory()
    run(api, job(engine="kuberl"), memory, 0.0, demand={})
    assert [r[0] for r in api.requests] == ["list"]
    run(api, job(engine="kuberl"), memory, 15.0, demand={})
    assert len(api.requests) == 1


def test_an_announced_image_gets_a_pool_that_goes_to_zero_when_idle_and_away_after_an_hour():
    api, memory, j = MemoryApi(), PoolsMemory(), job(engine="kuberl")
    outcome = run(api, j, memory, 0.0, demand={IMAGE: ImageDemand(upcoming=3)})
    assert api.kinds() == ["Deployment", "Service"]
    assert deployment(api)["spec"]["replicas"] == 2
    assert [(s.image, s.replicas) for s in outcome.statuses] == [(IMAGE, 2)]
    writes = len(api.requests)
    run(api, j, memory, 3.0, demand={IMAGE: ImageDemand(upcoming=3)})
    assert [r for r in api.requests[writes:] if r[0] != "list"] == []  # nothing changed: nothing written
    outcome = run(api, j, memory, 120.0, demand={})
    assert deployment(api)["spec"]["replicas"] == 0 and outcome.statuses == []
    run(api, j, memory, 120.0 + POOL_DELETE_AFTER_S, demand={})
    assert api.objects == {}


def test_an_image_whose_pods_cannot_pull_is_unusable_once_and_its_pool_held_at_zero():
    api, memory, j = MemoryApi(), PoolsMemory(), job(engine="kuberl")
    run(api, j, memory, 0.0, demand={IMAGE: ImageDemand(queued=4)})
    pod = {
        "metadata": {
            "name": "p",
            "labels": {"kuberl.io/job": "swe", "kuberl.io/tier": "sandbox", "kuberl.io/sandbox-pool": pool_key(IMAGE)},
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "sandbox",
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ErrImagePull", "message": "denied"}},
                }
            ]
        },
    }
    outcome = run(api, j, memory, 3.0, demand={IMAGE: ImageDemand(queued=4)}, pods=[pod])
    assert set(outcome.new_failures) == {IMAGE}
    (entry,) = outcome.statuses
    assert (entry.unusable, entry.reason, entry.message, entry.replicas) == (True, "ErrImagePull", "denied", 0)
    assert deployment(api)["spec"]["replicas"] == 0
    again = run(api, j, memory, 6.0, demand={IMAGE: ImageDemand(queued=4)}, pods=[pod])
    assert again.new_failures == {} and deployment(api)["spec"]["replicas"] == 0


def test_the_caps_count_the_default_pools_pods():
    api, memory = MemoryApi(), PoolsMemory()
    j = job(engine="kuberl")  # maxReplicas 8, the default pool holds 1 (run's default_replicas)
    outcome = run(api, j, memory, 0.0, demand={IMAGE: ImageDemand(queued=40)})
    assert deployment(api)["spec"]["replicas"] == 7 and outcome.capped > 0


def test_auto_finds_agent_sandbox_and_a_template_change_shows_on_the_warm_pool():
    api, memory = MemoryApi(agent_sandbox=True), PoolsMemory()
    run(api, job(), memory, 0.0, demand={IMAGE: ImageDemand(upcoming=1)})
    assert api.kinds() == ["SandboxTemplate", "SandboxWarmPool", "Service"]
    name = pool_service_name("swe", IMAGE)
    warm_path = f"/apis/{AGENT_SANDBOX_API}/namespaces/{NS}/sandboxwarmpools/{name}"
    digest = api.objects[warm_path]["metadata"]["annotations"][TEMPLATE_DIGEST_ANNOTATION]
    changed = job(warmReplicas=1).model_copy(deep=True)
    changed.spec.sandbox.resources.limits["memory"] = "16Gi"
    run(api, changed, memory, 3.0, demand={IMAGE: ImageDemand(upcoming=1)})
    assert api.objects[warm_path]["metadata"]["annotations"][TEMPLATE_DIGEST_ANNOTATION] != digest
    template = api.objects[f"/apis/{AGENT_SANDBOX_API}/namespaces/{NS}/sandboxtemplates/{name}"]
    assert template["spec"]["podTemplate"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "16Gi"


def test_a_stopped_job_has_every_pool_at_zero_whatever_the_engine():
    api = MemoryApi(agent_sandbox=True)
    j = job()
    for engine, image in (("kuberl", IMAGE), ("agent-sandbox", "registry.example.com/swe/b:1")):
        for obj in pool_objects(j, {image: 3}, NS, None, "t", SECURITY, IMAGES, engine):
            api.apply(obj, "test")
    written = scale_pools_to_zero(api, j, NS)  # type: ignore[arg-type]
    assert sorted(w.split("/")[0] for w in written) == ["Deployment", "SandboxWarmPool"]
    assert {o["spec"].get("replicas") for o in api.objects.values() if o["kind"] != "Service"} - {None} == {0}
