"""Sandbox pools per image, driven by the real operator (`kopf run`) against the emulated API server.

The rollout tier is played by real RolloutMetrics registries served over HTTP on the rollout pods' IPs, with
demand per image; the kubelet by the test, which creates pool pods and sets their status. Each test has its
own job; the agent-sandbox test installs that project's CRDs and so runs last.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers.emulator import HANDLERS, Api, emulated_api_server, write_kubeconfig
from prometheus_client import start_http_server
from test_operator_kmock import NS, PODS, RLJOBS, Operator, create_job, event_reasons, start_pods, status, wait_for
from test_operator_kmock import wait_phase as wait_phase

from kuberl.api.sandbox_images import pool_key, pool_service_name
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_sandbox.local import free_port

pytestmark = pytest.mark.slow  # a kopf process against the emulated API server in every test

DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
SERVICES = f"/api/v1/namespaces/{NS}/services"
AGENT_SANDBOX = f"/apis/extensions.agents.x-k8s.io/v1beta1/namespaces/{NS}"
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CAPPED, FAILURES = "kuberl_operator_sandbox_pool_capped_pods", "kuberl_operator_sandbox_image_failures_total"
IMAGE_A = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
IMAGE_B = "docker.io/swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"
IMAGE_C = "docker.io/swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Operator]]:
    folder = tmp_path_factory.mktemp("pools")
    with emulated_api_server() as url:
        operator = Operator(write_kubeconfig(folder / "kubeconfig", url, NS), folder / "operator.log")
        operator.start([sys.executable, *HANDLERS])
        try:
            yield Api(url), operator
        finally:
            operator.stop()


def running_job(
    api: Api, name: str, engine: str = "kuberl", job_spec: dict[str, Any] | None = None, **sandbox: Any
) -> RolloutMetrics:
    """A Running job with one rollout server whose metrics the operator scrapes; returns that server's metrics."""
    metrics = RolloutMetrics()
    port = free_port()
    start_http_server(port, "127.0.0.1", registry=metrics.registry)
    spec = {"minReplicas": 1, "maxReplicas": 4, "sessionsPerPod": 2, **sandbox}
    spec["pools"] = {
        "idleTimeout": "3s",
        "warmReplicas": 1,
        "maxWarmImages": 2,
        "engine": engine,
        **sandbox.get("pools", {}),
    }
    create_job(api, name, sandbox=spec, **(job_spec or {}))
    wait_phase(api, name, "Initializing")
    start_pods(api, name, "learner", 2)
    start_pods(api, name, "sandbox", 1)
    start_pods(api, name, "rollout", 1)
    api.patch(
        f"{PODS}/{name}-rollout-0",
        {
            "spec": {"containers": [{"name": "rollout", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"podIP": "127.0.0.1"},
        },
    )
    start_pods(api, name, "rollout", 1, first=1)
    wait_phase(api, name, "Running")
    return metrics


def pool_replicas(api: Api, job: str, image: str, collection: str = DEPLOYMENTS) -> int | None:
    obj = api.get(f"{collection}/{pool_service_name(job, image)}")
    return None if obj is None else obj["spec"]["replicas"]


def pool_pod(api: Api, job: str, image: str, status: dict[str, Any]) -> None:
    """A pool pod as its Deployment and the kubelet would make it, with this status."""
    api.post(
        PODS,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{pool_service_name(job, image)}-abc12",
                "namespace": NS,
                "labels": {
                    "kuberl.io/job": job,
                    "kuberl.io/tier": "sandbox",
                    "kuberl.io/sandbox-pool": pool_key(image),
                },
            },
            "status": status,
        },
    )


def pools_status(api: Api, job: str) -> dict[str, dict[str, Any]]:
    return {p["image"]: p for p in status(api, job).get("sandboxPools") or []}


def test_upcoming_images_are_warmed_within_the_caps_and_idle_pools_go_to_zero(cluster):
    """Three images announced: the planner warms two (maxWarmImages), within maxReplicas 4 over every pool
    (the default pool holds one); the third is denied by the cap. Idle for the idle timeout, they go to zero."""
    api, operator = cluster
    metrics = running_job(api, "warm")
    metrics.upcoming.set(3, IMAGE_A)
    metrics.upcoming.set(1, IMAGE_B)
    metrics.upcoming.set(1, IMAGE_C)
    wait_for(
        "two pools warmed",
        lambda: pool_replicas(api, "warm", IMAGE_A) == 2 and pool_replicas(api, "warm", IMAGE_B) == 1,
    )
    assert pool_replicas(api, "warm", IMAGE_C) is None  # maxWarmImages: no pool made for it
    service = api.get(f"{SERVICES}/{pool_service_name('warm', IMAGE_A)}")
    assert service["spec"]["selector"]["kuberl.io/sandbox-pool"] == pool_key(IMAGE_A)
    deployment = api.get(f"{DEPLOYMENTS}/{pool_service_name('warm', IMAGE_A)}")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE_A
    wait_for("pools in the status", lambda: set(pools_status(api, "warm")) == {IMAGE_A, IMAGE_B})
    capped = wait_for(
        "the cap is measured",
        lambda: operator.metrics().get(CAPPED + '{"namespace": "default", "rljob": "warm"}'),
    )
    assert capped >= 1

    for image in (IMAGE_A, IMAGE_B, IMAGE_C):
        metrics.upcoming.set(0, image)
    wait_for(
        "idle pools at zero", lambda: pool_replicas(api, "warm", IMAGE_A) == pool_replicas(api, "warm", IMAGE_B) == 0
    )
    assert api.get(f"{SERVICES}/{pool_service_name('warm', IMAGE_A)}") is not None  # kept for the image's return
    wait_for("no pool in the status", lambda: pools_status(api, "warm") == {})


def test_running_episodes_scale_their_pool_and_a_suspended_job_takes_it_to_zero(cluster):
    api, _ = cluster
    metrics = running_job(api, "busy", maxReplicas=8)
    metrics.active_sessions.set(4, IMAGE_A)
    metrics.queued.set(2, IMAGE_A)
    # 6 sessions wanted, 2 a pod, 25 % headroom: 4 pods
    wait_for("pool scaled on demand", lambda: pool_replicas(api, "busy", IMAGE_A) == 4)
    api.patch(f"{RLJOBS}/busy", {"spec": {"suspend": True}})
    wait_for("pool at zero while suspended", lambda: pool_replicas(api, "busy", IMAGE_A) == 0)


def test_a_job_stopped_by_a_breaker_takes_its_pools_to_zero(cluster):
    api, _ = cluster
    metrics = running_job(api, "stopping", job_spec={"limits": {"maxWallClock": "10s"}})
    metrics.queued.set(2, IMAGE_A)
    wait_for("pool made", lambda: (pool_replicas(api, "stopping", IMAGE_A) or 0) >= 1)
    wait_phase(api, "stopping", "Stopped")
    wait_for("pool at zero once stopped", lambda: pool_replicas(api, "stopping", IMAGE_A) == 0)


def test_an_image_that_cannot_be_pulled_is_unusable_and_its_pool_goes_to_zero(cluster):
    api, operator = cluster
    metrics = running_job(api, "pull")
    metrics.queued.set(2, IMAGE_A)
    wait_for("pool made", lambda: (pool_replicas(api, "pull", IMAGE_A) or 0) >= 1)
    message = f'Back-off pulling image "{IMAGE_A}"'
    pool_pod(
        api,
        "pull",
        IMAGE_A,
        {
            "phase": "Pending",
            "containerStatuses": [
                {
                    "name": "sandbox",
                    "restartCount": 0,
                    "state": {"waiting": {"reason": "ImagePullBackOff", "message": message}},
                }
            ],
        },
    )
    entry = wait_for(
        "unusable in the status",
        lambda: pools_status(api, "pull").get(IMAGE_A, {}).get("unusable") and pools_status(api, "pull")[IMAGE_A],
    )
    assert entry["reason"] == "ImagePullBackOff"
    assert entry["message"] == message
    assert entry["pool"] == pool_service_name("pull", IMAGE_A)
    wait_for("its pool at zero", lambda: pool_replicas(api, "pull", IMAGE_A) == 0)
    assert "SandboxImageUnusable" in event_reasons(api, "pull")
    failures = operator.metrics()
    key = FAILURES + '{"namespace": "default", "reason": "ImagePullBackOff", "rljob": "pull"}'
    assert failures.get(key) == 1.0
    time.sleep(2)  # demand stays: the image stays masked and its pool at zero
    assert pool_replicas(api, "pull", IMAGE_A) == 0
    assert status(api, "pull")["phase"] == "Running"  # the job itself is fine


def agent_sandbox_crd(kind: str, plural: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.extensions.agents.x-k8s.io"},
        "spec": {
            "group": "extensions.agents.x-k8s.io",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"},
            "versions": [
                {
                    "name": "v1beta1",
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def test_with_agent_sandbox_installed_each_pool_is_a_template_and_a_warm_pool(cluster):
    """engine auto: the cluster serves SandboxTemplate and SandboxWarmPool, so the pools are made of them."""
    api, _ = cluster
    for kind, plural in (("SandboxTemplate", "sandboxtemplates"), ("SandboxWarmPool", "sandboxwarmpools")):
        api.post(CRDS, agent_sandbox_crd(kind, plural))
    metrics = running_job(api, "agents", engine="auto")
    metrics.upcoming.set(3, IMAGE_A)
    warm_pools = f"{AGENT_SANDBOX}/sandboxwarmpools"
    wait_for("a warm pool", lambda: pool_replicas(api, "agents", IMAGE_A, warm_pools) == 2)
    name = pool_service_name("agents", IMAGE_A)
    warm_pool = api.get(f"{warm_pools}/{name}")
    assert warm_pool["spec"]["sandboxTemplateRef"] == {"name": name}
    template = api.get(f"{AGENT_SANDBOX}/sandboxtemplates/{name}")
    pod = template["spec"]["podTemplate"]
    assert pod["metadata"]["labels"]["kuberl.io/sandbox-pool"] == pool_key(IMAGE_A)
    assert pod["spec"]["containers"][0]["image"] == IMAGE_A
    assert template["spec"]["networkPolicyManagement"] == "Unmanaged"
    assert api.get(f"{SERVICES}/{name}")["spec"]["selector"]["kuberl.io/sandbox-pool"] == pool_key(IMAGE_A)
    assert api.get(f"{DEPLOYMENTS}/{name}") is None
    metrics.upcoming.set(0, IMAGE_A)
    wait_for("warm pool at zero", lambda: pool_replicas(api, "agents", IMAGE_A, warm_pools) == 0)
