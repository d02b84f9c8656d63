"""What `kuberl run` tells Prometheus: every endpoint of the run with the labels a PodMonitor gives pods in a
cluster (prometheus_targets), and the job-level metrics of its one job (RunMetrics), from the learner's
status.json and the runner's own phase, restarts and processes."""

from __future__ import annotations

import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from kuberl.api.rljob import RLJob
from kuberl.api.status import Phase, Reason
from kuberl_app.one_machine.processes import Ports, ProcessSpec, prometheus_targets
from kuberl_app.one_machine.runner import RunMetrics, Stop
from kuberl_app.one_machine.supervisor import Supervisor
from kuberl_sandbox.local import free_port


def rljob(namespace: str | None = None, **spec) -> RLJob:
    metadata = {"name": "toy", **({"namespace": namespace} if namespace else {})}
    return RLJob.from_manifest(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": metadata,
            "spec": {"model": {"uri": "s3://models/tiny"}, **spec},
        }
    )


def samples(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        s.name + json.dumps(s.labels, sort_keys=True): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_every_endpoint_is_a_file_sd_target_labelled_like_a_pod_in_a_cluster():
    targets = prometheus_targets(rljob("ml"), Ports([8701, 8702], [8801], 9401), job_metrics_port=9501)
    ids = {"namespace": "ml", "rljob": "toy"}
    assert targets == [
        {"targets": ["127.0.0.1:8701"], "labels": {**ids, "tier": "sandbox", "pod": "sandbox-0"}},
        {"targets": ["127.0.0.1:8702"], "labels": {**ids, "tier": "sandbox", "pod": "sandbox-1"}},
        {"targets": ["127.0.0.1:8801"], "labels": {**ids, "tier": "rollout", "pod": "rollout-0"}},
        {"targets": ["127.0.0.1:9401"], "labels": {**ids, "tier": "learner", "pod": "learner"}},
        # the job metrics carry namespace and rljob themselves (a target label would rename them exported_*)
        {"targets": ["127.0.0.1:9501"], "labels": {"pod": "kuberl-run"}},
    ]
    assert prometheus_targets(rljob(), Ports([1], [2], 3))[0]["labels"]["namespace"] == "default"
    assert len(prometheus_targets(rljob(), Ports([1], [2], 3))) == 3  # no job metrics port: no such target


def test_the_job_metrics_follow_the_learner_status_and_the_runner(tmp_path):
    job = rljob("ml", sandbox={"minReplicas": 2, "maxReplicas": 4})
    (tmp_path / "status.json").write_text(
        json.dumps(
            {
                "phase": "Running",
                "reason": "Training",
                "step": 4,
                "policyVersion": 4,
                "rewardMean": 0.5,
                "tokensPerSecond": 90.0,
                "staleness": 0.0,
                "lastCheckpoint": {"step": 4, "uri": "file:///c/4", "time": "2026-01-01T00:00:00Z"},
            }
        )
    )
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    processes = (("sandbox-0", "sandbox"), ("sandbox-1", "sandbox"), ("learner", "learner"))
    specs = [ProcessSpec(name, tier, sleeper, log=tmp_path / f"{name}.log") for name, tier in processes]
    supervisor = Supervisor(specs, retry_budget=5, log=lambda line: None)
    metrics = RunMetrics(job, tmp_path, port := free_port())
    ids = {"namespace": "ml", "rljob": "toy"}

    def value(name: str, **labels: str) -> float | None:
        return samples(port).get(name + json.dumps({**ids, **labels}, sort_keys=True))

    try:
        metrics.publish(Phase.INITIALIZING, 1.0)
        assert value("kuberl_job_phase", phase="Initializing") == 1.0
        assert value("kuberl_job_step") == 4.0  # a resumed run's learner status counts from the start
        for spec in specs:
            supervisor.start(spec.name)
        supervisor.restarts["sandbox"] += 1
        metrics.publish(Phase.RUNNING, 30.0, supervisor)
        assert value("kuberl_job_phase", phase="Running") == 1.0 and value("kuberl_job_phase", phase="Pending") == 0
        assert (value("kuberl_job_reward_mean"), value("kuberl_job_running_seconds")) == (0.5, 30.0)
        assert value("kuberl_job_checkpoint_last_timestamp_seconds") == 1767225600.0
        assert value("kuberl_job_ready_workers", tier="sandbox") == 2
        assert value("kuberl_job_ready_workers", tier="rollout") == 0
        assert value("kuberl_job_restarts_total", tier="sandbox") == 1
        assert value("kuberl_job_sandbox_desired_replicas") == 2
        assert not any(key.startswith("kuberl_job_breaker_trips_total") for key in samples(port))

        supervisor.stop_all()
        metrics.publish(Phase.RUNNING, 40.0, supervisor, Stop(Phase.STOPPED, Reason.MAX_WALL_CLOCK_REACHED, "ran 40 s"))
        assert value("kuberl_job_phase", phase="Stopped") == 1.0
        assert value("kuberl_job_breaker_trips_total", reason="MaxWallClockReached") == 1.0
        assert value("kuberl_job_ready_workers", tier="sandbox") == 0
    finally:
        supervisor.stop_all()
        metrics.close()
