"""Each tier's process gets the same command line from the operator's pod and from `kuberl run`."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import with_spec

from kuberl.api.command_lines import sandbox_max_sessions
from kuberl.api.rljob import RLJob
from kuberl_app.one_machine.processes import Ports, plan
from kuberl_operator.desired import desired_objects


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def commands(job: RLJob) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(tier -> the pod's command, tier -> the local process's argv) of one job."""
    pods = {
        obj["metadata"]["labels"]["kuberl.io/tier"]: obj["spec"]["template"]["spec"]["containers"][0]["command"]
        for obj in desired_objects(job, "ns", owner=None)
        if obj["kind"] in ("Deployment", "StatefulSet")
    }
    ports = Ports([8701], [8801], 9400)
    local = plan(job, Path("job.yaml"), Path("runs/j"), "/m", ports, "tok", Path("/tmp/sbx"), cpus=2)
    return pods, {spec.tier: spec.argv for spec in local}


def test_pods_and_local_processes_run_the_same_commands_with_one_max_sessions_rule():
    job = RLJob.from_manifest(with_spec(sandbox={"sessionsPerPod": 5}, rollout={"concurrentSessions": 64}))
    pods, local = commands(job)
    assert pods["sandbox"][:4] == ["python", "-m", "kuberl_app.cli", "sandbox"]
    assert local["sandbox"][:4] == [sys.executable, "-m", "kuberl_app.cli", "sandbox"]
    for argv in (pods["sandbox"], local["sandbox"]):
        assert option(argv, "--max-sessions") == str(sandbox_max_sessions(job)) == "10"
        assert option(argv, "--session-timeout") == job.spec.sandbox.session.timeout
    assert pods["rollout"][1:4] == local["rollout"][1:4] == ["-m", "kuberl_app.cli", "rollout-server"]
    assert "--model" not in pods["rollout"] and option(local["rollout"], "--model") == "/m"
    # the learner: torchrun in a pod, the same `learner` arguments after the launcher
    pod_args = pods["learner"][pods["learner"].index("learner") :]
    local_args = local["learner"][local["learner"].index("learner") :]
    assert [a for a in pod_args if a.startswith("--")] == ["--run-dir", "--metrics-port", "--rollout-url"]
    assert [a for a in local_args if a.startswith("--")] == ["--model", "--run-dir", "--metrics-port", "--rollout-url"]
