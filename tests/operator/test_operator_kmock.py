"""The operator as a real `kopf run` process against kmock (a Kubernetes API emulator) over HTTP.

kmock has no controllers: the tests play the StatefulSet controller and the kubelet, creating the pods
and setting their status, and play the learner, writing its step and checkpoint into the RLJob status.
One emulator and one operator serve every test; each test has its own job.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import polling
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server, write_kubeconfig
from prometheus_client import start_http_server
from prometheus_client.parser import text_string_to_metric_families

from kuberl_rollout.metrics import RolloutMetrics
from kuberl_sandbox.local import free_port

NS = "default"
RLJOBS = f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
STATEFULSETS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
CHILDREN = [  # (collection, name suffix) of every object the operator applies
    (f"/api/v1/namespaces/{NS}/serviceaccounts", "learner"),
    (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles", "learner"),
    (f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings", "learner"),
    (CONFIGMAPS, "config"),
    (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", "sandbox"),
    (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", "rollout"),
    (f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies", "learner"),
    (f"/api/v1/namespaces/{NS}/services", "sandbox"),
    (f"/api/v1/namespaces/{NS}/services", "rollout"),
    (f"/api/v1/namespaces/{NS}/services", "learner"),
    (f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", "rollout"),
    (f"/apis/policy/v1/namespaces/{NS}/poddisruptionbudgets", "learner"),
    (f"/apis/apps/v1/namespaces/{NS}/deployments", "sandbox"),
    (STATEFULSETS, "rollout"),
    (STATEFULSETS, "learner"),
    (SECRETS, "sandbox-token"),
    (SECRETS, "job-token"),
]
TIMEOUT_S = 45.0  # generous: the 2 CPU cores may be shared with other work


class Operator(OperatorProcess):
    """The operator with a short observation interval, so that the scenarios run in seconds."""

    def __init__(self, kubeconfig: Path, log: Path) -> None:
        self.metrics_port = free_port()
        super().__init__(
            kubeconfig,
            log,
            {
                "KUBERL_OPERATOR_INTERVAL": "1",
                "KUBERL_WATCH_SERVER_TIMEOUT": "60",
                "KUBERL_OPERATOR_METRICS_PORT": str(self.metrics_port),
                "KUBERL_OPERATOR_AUTOSCALE_INTERVAL": "1",
            },
        )

    def metrics(self) -> dict[str, float]:
        """The operator's /metrics as {'name{labels}': value}."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        return {
            sample.name + json.dumps(sample.labels, sort_keys=True): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Operator]]:
    folder = tmp_path_factory.mktemp("operator")
    with emulated_api_server() as url:
        operator = Operator(write_kubeconfig(folder / "kubeconfig", url, NS), folder / "operator.log")
        operator.start([sys.executable, *HANDLERS])
        try:
            yield Api(url), operator
        finally:
            operator.stop()


@pytest.fixture(autouse=True)
def delete_jobs_after(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test's jobs are deleted after it, so the operator watches only the test at hand."""
    yield
    if "cluster" in request.fixturenames:
        api = request.getfixturevalue("cluster")[0]
        for job in api.items(RLJOBS):
            api.delete(f"{RLJOBS}/{job['metadata']['name']}")
        # the next test starts on an idle operator: less contention, steadier timings. Only a courtesy (each
        # test has its own job names, and deletion is asserted by its own test), so a slow machine does not fail
        # here: after the operator-restart test the finalizers can take longer than the timeout
        with contextlib.suppress(AssertionError):
            wait_for("jobs deleted", lambda: not api.items(RLJOBS), timeout=2 * TIMEOUT_S)


def wait_for(what: str, check: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    return polling.wait_for(what, check, timeout)


def create_job(api: Api, name: str, **spec: Any) -> None:
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name, "namespace": NS},  # uid and resourceVersion come from the emulator
        "spec": {
            "model": {"uri": "s3://models/tiny"},
            "checkpoint": {"uri": "s3://ckpt/jobs"},
            "learner": {"replicas": 2},
            "rollout": {"replicas": 2},
            **spec,
        },
    }
    api.post(RLJOBS, manifest)


def status(api: Api, name: str) -> dict[str, Any]:
    return (api.get(f"{RLJOBS}/{name}") or {}).get("status") or {}


def wait_phase(api: Api, name: str, phase: str, timeout: float = TIMEOUT_S) -> dict[str, Any]:
    try:
        return wait_for(f"{name} {phase}", lambda: (s := status(api, name)).get("phase") == phase and s, timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}; status: {status(api, name)}") from None


def start_pods(api: Api, job: str, tier: str, count: int, first: int = 0) -> list[str]:
    """Ready pods of a tier, as the StatefulSet controller and the kubelet would make them; returns uids."""
    uids = []
    for i in range(first, first + count):
        uid = str(uuid.uuid4())
        api.post(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{job}-{tier}-{i}",
                    "namespace": NS,
                    "uid": uid,
                    "labels": {"kuberl.io/job": job, "kuberl.io/tier": tier},
                },
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            },
        )
        uids.append(uid)
    return uids


def start_all(api: Api, job: str) -> dict[str, list[str]]:
    return {tier: start_pods(api, job, tier, n) for tier, n in (("learner", 2), ("rollout", 2), ("sandbox", 1))}


def pod_uids(api: Api, job: str, tier: str) -> list[str]:
    return sorted(
        p["metadata"]["uid"]
        for p in api.items(PODS)
        if p["metadata"]["labels"].get("kuberl.io/job") == job and p["metadata"]["labels"].get("kuberl.io/tier") == tier
    )


def children(api: Api, job: str) -> list[dict[str, Any] | None]:
    return [api.get(f"{path}/{job}-{suffix}") for path, suffix in CHILDREN]


def replicas(api: Api, job: str) -> dict[str, int]:
    sets = {tier: api.get(f"{STATEFULSETS}/{job}-{tier}") for tier in ("learner", "rollout")}
    return {tier: s["spec"]["replicas"] for tier, s in sets.items() if s}


def event_reasons(api: Api, job: str) -> list[str]:
    events = api.items(f"/api/v1/namespaces/{NS}/events")
    return [e.get("reason") for e in events if (e.get("involvedObject") or {}).get("name") == job]


def test_job_runs_recovers_from_a_learner_failure_and_replaces_rollout_pods(cluster):
    api, _ = cluster
    create_job(api, "train", limits={"retryBudget": 3})
    wait_for("every child", lambda: all(children(api, "train")))
    wait_phase(api, "train", "Initializing")
    assert replicas(api, "train") == {"learner": 2, "rollout": 2}

    pods = start_all(api, "train")
    api.patch(
        f"{RLJOBS}/train/status",
        {
            "status": {
                "step": 5,
                "policyVersion": 5,
                "lastCheckpoint": {"step": 4, "uri": "s3://ckpt/jobs/train/step-4"},
            }
        },
    )  # what the learner reports
    running = wait_phase(api, "train", "Running")
    assert running["step"] == 5 and running["readyWorkers"] == {"learner": 2, "rollout": 2, "sandbox": 1}
    assert running["startTime"]

    # a learner rank fails: the whole gang restarts from the newest checkpoint, and the restart counts
    api.patch(f"{PODS}/train-learner-1", {"status": {"phase": "Failed"}})
    recovering = wait_phase(api, "train", "Recovering")
    assert recovering["reason"] == "WorkerLost" and recovering["restarts"]["learner"] == 1
    assert "checkpoint step 4 (s3://ckpt/jobs/train/step-4)" in recovering["message"]
    wait_for("learner gang deleted", lambda: not pod_uids(api, "train", "learner"))
    assert pod_uids(api, "train", "rollout") == sorted(pods["rollout"])
    start_pods(api, "train", "learner", 2)
    wait_phase(api, "train", "Running")

    # a rollout pod fails: only it is replaced, the learner keeps training
    learners = pod_uids(api, "train", "learner")
    api.patch(f"{PODS}/train-rollout-1", {"status": {"phase": "Failed"}})
    wait_for("rollout restart counted", lambda: status(api, "train")["restarts"].get("rollout") == 1)
    wait_for("failed rollout pod deleted", lambda: api.get(f"{PODS}/train-rollout-1") is None)
    assert api.get(f"{PODS}/train-rollout-0")["metadata"]["uid"] == pods["rollout"][0]
    assert pod_uids(api, "train", "learner") == learners
    assert status(api, "train")["phase"] == "Running"
    start_pods(api, "train", "rollout", 1, first=1)  # the StatefulSet controller's replacement

    # a spot preemption of a learner pod restarts the gang but spends no retry budget
    api.patch(
        f"{PODS}/train-learner-0",
        {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]}},
    )
    preempted = wait_phase(api, "train", "Recovering")
    assert preempted["reason"] == "Preempted" and preempted["preemptions"] == 1
    assert preempted["restarts"]["learner"] == 1
    wait_for("learner gang deleted", lambda: not pod_uids(api, "train", "learner"))
    start_pods(api, "train", "learner", 2)
    wait_phase(api, "train", "Running")
    wait_for(
        "transition events",
        lambda: (
            {"CreatingWorkers", "Training", "WorkerLost", "WorkerReplaced", "Preempted"}
            <= set(event_reasons(api, "train"))
        ),
    )


def test_suspend_checkpoints_and_scales_to_zero_and_resume_continues_from_that_checkpoint(cluster):
    api, _ = cluster
    create_job(api, "pause", training={"totalSteps": 100})
    wait_phase(api, "pause", "Initializing")
    start_all(api, "pause")
    api.patch(f"{RLJOBS}/pause/status", {"status": {"step": 7}})
    wait_phase(api, "pause", "Running")

    api.patch(f"{RLJOBS}/pause", {"spec": {"suspend": True}})
    suspended = wait_phase(api, "pause", "Suspended")
    assert suspended["reason"] == "SuspendedByUser"
    wait_for("every tier at zero", lambda: replicas(api, "pause") == {"learner": 0, "rollout": 0})
    sandbox = f"/apis/apps/v1/namespaces/{NS}/deployments/pause-sandbox"
    wait_for("sandbox at zero", lambda: api.get(sandbox)["spec"]["replicas"] == 0)
    # the learner's preStop makes it write a final checkpoint and report it, then its pods go
    api.patch(
        f"{RLJOBS}/pause/status", {"status": {"lastCheckpoint": {"step": 7, "uri": "s3://ckpt/jobs/pause/step-7"}}}
    )
    for pod in api.items(PODS):
        if pod["metadata"]["name"].startswith("pause-"):
            api.delete(f"{PODS}/{pod['metadata']['name']}")
    time.sleep(3)  # several observations while suspended: nothing changes, nothing counts
    held = status(api, "pause")
    assert held["phase"] == "Suspended" and held["lastCheckpoint"]["step"] == 7
    assert not any((held.get("restarts") or {}).values()) and held.get("preemptions", 0) == 0

    api.patch(f"{RLJOBS}/pause", {"spec": {"suspend": False}})
    resumed = wait_phase(api, "pause", "Initializing")
    assert "resumes from checkpoint step 7 (s3://ckpt/jobs/pause/step-7)" in resumed["message"]
    wait_for("tiers scaled back", lambda: replicas(api, "pause") == {"learner": 2, "rollout": 2})
    start_all(api, "pause")
    running = wait_phase(api, "pause", "Running")
    assert running["step"] == 7 and running["lastCheckpoint"]["step"] == 7


def test_a_preemption_notice_on_a_rollout_node_replaces_its_pod_without_spending_the_budget(cluster):
    api, _ = cluster
    create_job(api, "notice", training={"totalSteps": 100})
    wait_phase(api, "notice", "Initializing")
    start_all(api, "notice")
    wait_phase(api, "notice", "Running")
    learners = pod_uids(api, "notice", "learner")
    api.post(
        "/api/v1/nodes",
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "spot-a", "labels": {"karpenter.sh/capacity-type": "spot"}},
        },
    )
    api.patch(f"{PODS}/notice-rollout-1", {"spec": {"nodeName": "spot-a"}})
    # the cloud announces the reclaim with a taint on the node
    api.patch("/api/v1/nodes/spot-a", {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
    wait_for("preempted pod deleted", lambda: api.get(f"{PODS}/notice-rollout-1") is None)
    preempted = status(api, "notice")
    assert preempted["preemptions"] == 1 and not any((preempted.get("restarts") or {}).values())
    assert preempted["phase"] == "Running" and pod_uids(api, "notice", "learner") == learners
    start_pods(api, "notice", "rollout", 1, first=1)  # the StatefulSet controller's replacement, on another node
    wait_for("replica restored", lambda: status(api, "notice")["readyWorkers"]["rollout"] == 2)
    assert status(api, "notice")["preemptions"] == 1
    api.delete("/api/v1/nodes/spot-a")


def test_a_queued_job_waits_for_kueue_runs_when_admitted_and_stops_when_evicted(cluster):
    api, _ = cluster
    workload = f"/apis/kueue.x-k8s.io/v1beta1/namespaces/{NS}/workloads/queued-queue"
    create_job(api, "queued", scheduling={"queueName": "team-a"})
    waiting = wait_phase(api, "queued", "Suspended")
    assert waiting["reason"] == "WaitingForAdmission" and "team-a" in waiting["message"]
    assert wait_for("the Workload", lambda: api.get(workload))["spec"]["queueName"] == "team-a"
    assert replicas(api, "queued") == {"learner": 0, "rollout": 0}  # no pod before admission

    # Kueue admits the whole job at once (the learner gang all or nothing)
    conditions = [{"type": "QuotaReserved", "status": "True"}, {"type": "Admitted", "status": "True"}]
    api.patch(f"{workload}/status", {"status": {"conditions": conditions}})
    wait_phase(api, "queued", "Initializing")
    wait_for("tiers scaled up", lambda: replicas(api, "queued") == {"learner": 2, "rollout": 2})
    start_all(api, "queued")
    wait_phase(api, "queued", "Running")

    # Kueue evicts it (a higher-priority workload): every tier down, the learner checkpoints on the way
    api.patch(f"{workload}/status", {"status": {"conditions": [*conditions, {"type": "Evicted", "status": "True"}]}})
    evicted = wait_phase(api, "queued", "Suspended")
    assert evicted["reason"] == "WaitingForAdmission"
    wait_for("tiers at zero", lambda: replicas(api, "queued") == {"learner": 0, "rollout": 0})


def test_the_sandbox_tier_follows_the_rollout_tiers_demand(cluster):
    """Two rollout servers' real metrics (RolloutMetrics, served over HTTP on the pods' IPs) report 16
    sessions wanted; at 4 sessions a pod plus headroom that is 5 sandbox pods, asked for in one step."""
    api, _ = cluster
    servers = [RolloutMetrics() for _ in range(2)]
    ports = [free_port() for _ in servers]
    for server, port in zip(servers, ports, strict=True):
        start_http_server(port, "127.0.0.1", registry=server.registry)
    create_job(api, "scaled", sandbox={"minReplicas": 1, "maxReplicas": 6, "sessionsPerPod": 4})
    wait_phase(api, "scaled", "Initializing")
    start_pods(api, "scaled", "learner", 2)
    start_pods(api, "scaled", "sandbox", 1)
    for i, port in enumerate(ports):
        start_pods(api, "scaled", "rollout", 1, first=i)
        api.patch(
            f"{PODS}/scaled-rollout-{i}",
            {
                "spec": {"containers": [{"name": "rollout", "ports": [{"name": "http", "containerPort": port}]}]},
                "status": {"podIP": "127.0.0.1"},
            },
        )
    wait_phase(api, "scaled", "Running")
    sandbox = f"/apis/apps/v1/namespaces/{NS}/deployments/scaled-sandbox"
    time.sleep(2)
    assert api.get(sandbox)["spec"]["replicas"] == 1  # nothing wanted yet: the minimum

    servers[0].active_sessions.set(6)
    servers[0].queued.set(2)
    servers[1].active_sessions.set(4)
    servers[1].queued.set(4)
    wait_for("sandbox scaled up", lambda: api.get(sandbox)["spec"]["replicas"] == 5)
    wait_for("status says so", lambda: status(api, "scaled").get("sandboxReplicas") == 5)
    assert "SandboxScaled" in event_reasons(api, "scaled")

    api.patch(f"{RLJOBS}/scaled", {"spec": {"sandbox": {"maxReplicas": 3}}})  # a safe change, applied at once
    wait_for("capped at the new maximum", lambda: api.get(sandbox)["spec"]["replicas"] == 3)
    servers[0].active_sessions.set(0)
    servers[0].queued.set(0)
    servers[1].active_sessions.set(0)
    servers[1].queued.set(0)
    time.sleep(3)  # demand gone: the scale-down waits for its stabilisation window (5 minutes)
    assert api.get(sandbox)["spec"]["replicas"] == 3


LEARNER_STOPPED_AT_MAX_STEPS = {"type": "LearnerStopped", "status": "True", "reason": "MaxStepsReached"}
"""The learner's stop report at limits.maxSteps (after its final checkpoint): the step limits are its own."""


@pytest.mark.parametrize(
    ("name", "limits", "report", "reason"),
    [
        ("steps", {"maxSteps": 20}, {"step": 20, "conditions": [LEARNER_STOPPED_AT_MAX_STEPS]}, "MaxStepsReached"),
        ("clock", {"maxWallClock": "2s"}, {"step": 1}, "MaxWallClockReached"),
    ],
)
def test_breaker_stops_the_job_and_scales_every_tier_to_zero(cluster, name, limits, report, reason):
    api, operator = cluster
    create_job(api, name, training={"totalSteps": 20}, limits=limits)
    wait_phase(api, name, "Initializing")
    start_all(api, name)
    step = report["step"]
    api.patch(f"{RLJOBS}/{name}/status", {"status": report})
    stopped = wait_phase(api, name, "Stopped")
    assert stopped["reason"] == reason and stopped["completionTime"]
    wait_for("tiers scaled to zero", lambda: replicas(api, name) == {"learner": 0, "rollout": 0})
    sandbox = f"/apis/apps/v1/namespaces/{NS}/deployments/{name}-sandbox"
    wait_for("sandbox scaled to zero", lambda: api.get(sandbox)["spec"]["replicas"] == 0)

    # what Prometheus sees: the job's phase, the breaker that tripped, the operator's own handler timings
    ids = {"namespace": NS, "rljob": name}
    metrics = wait_for(
        "job metrics",
        lambda: (
            (m := operator.metrics()).get("kuberl_job_phase" + json.dumps({**ids, "phase": "Stopped"}, sort_keys=True))
            == 1
            and m
        ),
    )
    assert metrics["kuberl_job_phase" + json.dumps({**ids, "phase": "Running"}, sort_keys=True)] == 0
    assert metrics["kuberl_job_breaker_trips_total" + json.dumps({**ids, "reason": reason}, sort_keys=True)] == 1
    assert metrics["kuberl_job_step" + json.dumps(ids, sort_keys=True)] == step
    assert metrics['kuberl_operator_reconcile_duration_seconds_count{"handler": "observe"}'] > 0
    assert metrics['kuberl_operator_reconcile_duration_seconds_count{"handler": "create"}'] > 0


def test_children_are_applied_server_side_and_an_hpas_replicas_stay_its_own(cluster):
    """The operator applies its children under its field manager; a spec change re-applies them and leaves
    the sandbox replicas that an HPA chose."""
    api, _ = cluster
    create_job(api, "hpa", sandbox={"autoscaler": "hpa", "minReplicas": 1, "maxReplicas": 6})
    wait_for("every child", lambda: all(children(api, "hpa")))
    applied = {"manager": "kuberl-operator", "operation": "Apply", "apiVersion": "apps/v1"}
    assert applied in api.get(f"{STATEFULSETS}/hpa-learner")["metadata"]["managedFields"]
    sandbox = f"/apis/apps/v1/namespaces/{NS}/deployments/hpa-sandbox"
    api.patch(sandbox, {"spec": {"replicas": 4}})  # the HPA scales the tier
    api.patch(f"{RLJOBS}/hpa", {"spec": {"rollout": {"replicas": 3}}})
    wait_for("rollout scaled to 3", lambda: replicas(api, "hpa").get("rollout") == 3)
    assert api.get(sandbox)["spec"]["replicas"] == 4


def test_invalid_spec_fails_with_a_message(cluster):
    api, _ = cluster
    create_job(api, "invalid", learner={"replicas": 0})
    failed = wait_phase(api, "invalid", "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.learner.replicas" in failed["message"]
    assert api.get(f"{STATEFULSETS}/invalid-learner") is None


def test_safe_spec_changes_apply_and_unsafe_ones_are_refused(cluster):
    api, _ = cluster
    create_job(api, "change")
    wait_phase(api, "change", "Initializing")
    api.patch(f"{RLJOBS}/change", {"spec": {"rollout": {"replicas": 3}}})
    wait_for("rollout scaled to 3", lambda: replicas(api, "change").get("rollout") == 3)
    config = api.get(f"{CONFIGMAPS}/change-config")["data"]["job.yaml"]
    api.patch(f"{RLJOBS}/change", {"spec": {"model": {"uri": "s3://models/other"}, "rollout": {"replicas": 1}}})
    refused = wait_for(
        "refusal condition",
        lambda: next(
            (
                c
                for c in status(api, "change").get("conditions", [])
                if c["type"] == "SpecChangeRefused" and c["status"] == "True"
            ),
            None,
        ),
    )
    assert "spec.model" in refused["message"]
    assert api.get(f"{CONFIGMAPS}/change-config")["data"]["job.yaml"] == config
    assert replicas(api, "change")["rollout"] == 3


def test_deletion_cleans_up_every_child(cluster):
    api, _ = cluster
    create_job(api, "gone")
    wait_for("every child", lambda: all(children(api, "gone")))
    start_all(api, "gone")
    wait_phase(api, "gone", "Running")
    api.delete(f"{RLJOBS}/gone")
    wait_for("children deleted", lambda: not any(children(api, "gone")))
    wait_for("pods deleted", lambda: not any(pod_uids(api, "gone", t) for t in ("learner", "rollout", "sandbox")))
    wait_for("job deleted (finalizer released)", lambda: api.get(f"{RLJOBS}/gone") is None)


def test_operator_killed_mid_way_converges_without_duplicates(cluster):
    api, operator = cluster
    create_job(api, "restart")
    wait_for("every child", lambda: all(children(api, "restart")))
    start_all(api, "restart")
    before = wait_phase(api, "restart", "Running")
    uids = [c["metadata"]["uid"] for c in children(api, "restart")]
    token = api.get(f"{SECRETS}/restart-sandbox-token")
    operator.stop()
    api.patch(f"{PODS}/restart-learner-0", {"status": {"phase": "Failed"}})  # a failure while it is down
    operator.start([sys.executable, "-m", "kuberl_app.cli", "operator"])
    recovering = wait_phase(api, "restart", "Recovering")
    assert recovering["restarts"]["learner"] == before.get("restarts", {}).get("learner", 0) + 1
    start_pods(api, "restart", "learner", 2)
    wait_phase(api, "restart", "Running")
    assert [c["metadata"]["uid"] for c in children(api, "restart")] == uids
    assert api.get(f"{SECRETS}/restart-sandbox-token") == token
    names = [p["metadata"]["name"] for p in api.items(PODS) if p["metadata"]["labels"]["kuberl.io/job"] == "restart"]
    assert len(names) == len(set(names)) == 5


def test_the_learners_own_report_drives_the_job(cluster):
    """The learner's writer (kuberl_trainer.cluster_status) against the operator's reader, through the API."""
    from kubernetes import config as kube_config

    from kuberl.api.status import Phase, Reason, RLJobStatus
    from kuberl.kube import Kube
    from kuberl_trainer.cluster_status import ClusterStatus

    api, operator = cluster
    create_job(api, "report")
    wait_phase(api, "report", "Initializing")
    start_all(api, "report")
    learner = ClusterStatus(Kube(kube_config.new_client_from_config(str(operator.kubeconfig))), NS, "report")
    learner.report(RLJobStatus(step=3, policy_version=3, reward_mean=0.25, staleness=0.5), force=True)
    running = wait_phase(api, "report", "Running")
    assert (running["step"], running["policyVersion"], running["rewardMean"]) == (3, 3, 0.25)

    final = RLJobStatus(
        phase=Phase.STOPPED,
        reason=Reason.NON_FINITE_LOSS,
        message="3 non-finite losses in a row",
        step=4,
        policy_version=4,
    )
    learner.stopped(final)
    stopped = wait_for("the stop acted on", lambda: (s := status(api, "report"))["reason"] == "NonFiniteLoss" and s)
    assert stopped["phase"] in ("Stopped", "Failed") and "3 non-finite losses" in stopped["message"]
    conditions = {c["type"]: c for c in stopped["conditions"]}
    assert conditions["LearnerStopped"]["reason"] == "NonFiniteLoss" and "Ready" in conditions  # both writers' kept
