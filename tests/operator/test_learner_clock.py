"""The job's wall clock survives learner gang restarts: the state machine records when the clock counts from,
and the learner pods the operator makes after a restart carry it (KUBERL_JOB_STARTED_AT), so a restarted
learner stops at the job's deadline, not a whole maxWallClock after its own start."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from helpers.emulator import Api, emulated_api_server, write_kubeconfig
from kubernetes import config as kube_config

from kuberl.api.env_vars import JOB_STARTED_AT
from kuberl.api.rljob import RLJob
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Phase, RLJobStatus
from kuberl.kube import Kube
from kuberl_operator import reconcile
from kuberl_operator.apply import apply_children
from kuberl_operator.lifecycle import Observed, TierState, next_state

NS = "default"
RLJOBS = f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
STATEFULSETS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SPEC = RLJobSpec.model_validate({"model": {"uri": "s3://models/tiny"}, "checkpoint": {"uri": "s3://ckpt/jobs"}})
READY = {"learner": TierState(1, 1), "rollout": TierState(1, 1), "sandbox": TierState(1, 1)}


def test_the_clock_starts_once_when_the_job_first_runs_and_a_gang_restart_keeps_it():
    running = next_state(SPEC, RLJobStatus(phase=Phase.INITIALIZING), Observed(T0, READY)).status
    assert running.phase == Phase.RUNNING and running.start_time == running.clock_start_time == T0
    failed = {**READY, "learner": TierState(1, 0, ("j-learner-0",))}
    later = T0 + timedelta(hours=1)
    recovering = next_state(SPEC, running, Observed(later, failed)).status
    again = next_state(SPEC, recovering, Observed(later + timedelta(minutes=5), READY)).status
    assert again.phase == Phase.RUNNING and again.clock_start_time == T0 and again.start_time == T0


def test_leaving_suspended_moves_the_clock_by_the_time_the_job_did_not_run():
    suspended = RLJobStatus(phase=Phase.SUSPENDED, start_time=T0, clock_start_time=T0, running_seconds=3600.0)
    resumed_at = T0 + timedelta(days=3)
    status = next_state(SPEC, suspended, Observed(resumed_at, {})).status
    assert status.phase == Phase.INITIALIZING
    assert status.clock_start_time == resumed_at - timedelta(hours=1) and status.start_time == T0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Kube]]:
    with emulated_api_server() as url:
        kubeconfig = write_kubeconfig(tmp_path_factory.mktemp("clock") / "kubeconfig", url, NS)
        yield Api(url), Kube(kube_config.new_client_from_config(str(kubeconfig)))


def learner_env(api: Api, job: str) -> dict[str, Any]:
    container = api.get(f"{STATEFULSETS}/{job}-learner")["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def pod(job: str, tier: str, i: int, phase: str = "Running") -> dict[str, Any]:
    labels = {"kuberl.io/job": job, "kuberl.io/tier": tier}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-{tier}-{i}", "namespace": NS, "labels": labels},
        "status": {"phase": phase, "conditions": [{"type": "Ready", "status": str(phase == "Running")}]},
    }


def test_a_restarted_learner_gang_is_made_with_the_jobs_clock_start(server):
    api, kube = server
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "clock", "namespace": NS}}
    manifest["spec"] = {
        "model": {"uri": "s3://models/tiny"},
        "checkpoint": {"uri": "s3://ckpt/jobs"},
        "learner": {"replicas": 2},
    }
    uid = api.post(RLJOBS, manifest)["metadata"]["uid"]
    apply_children(kube, RLJob.model_validate(manifest), NS, uid, scaled_down=False, new=True)
    assert JOB_STARTED_AT not in learner_env(api, "clock")  # the first gang starts with the job: its own clock
    started = T0 + timedelta(seconds=0.25)
    status = RLJobStatus(phase=Phase.RUNNING, start_time=started, clock_start_time=started, running_seconds=7200.0)
    api.patch(f"{RLJOBS}/clock/status", {"status": status.model_dump(mode="json", by_alias=True, exclude_none=True)})
    pods = [pod("clock", "learner", 0), pod("clock", "learner", 1, "Failed"), pod("clock", "rollout", 0)]
    pods.append(pod("clock", "sandbox", 0))
    for p in pods:
        api.post(PODS, p)

    now = started + timedelta(hours=2)
    new = reconcile.drive(kube, api.get(f"{RLJOBS}/clock"), pods, reconcile.Memory(), now, lambda event: None)

    assert new.phase == Phase.RECOVERING and new.clock_start_time == started
    assert learner_env(api, "clock")[JOB_STARTED_AT] == f"{started.timestamp():.3f}"
    assert not [p for p in api.items(PODS) if p["metadata"]["labels"]["kuberl.io/tier"] == "learner"]
