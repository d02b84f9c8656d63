"""From `kubectl apply` to a trained policy, with the operator's own pods running for real.

The operator runs unchanged (`kuberl operator`) against the emulated API server; the test node agent
(tests/cluster/kubelet.py) runs the pods it creates, each in its own network namespace, from the very
commands, environment, volumes, Service names and probes the builders render; SeaweedFS is the S3 store;
the real `kubectl` drives it all as a user would. A tiny Llama trains for a few steps on CPU.
The sandbox pods run from the sandbox's real image (built once by tests/helpers/built_images.py; the checkout
stands in where this machine cannot build images) and isolate sessions as in production; the learner and
rollout pods run from the checkout. What this stands in for, and what it does not model, is in
docs/operator.md ("The end-to-end suite").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cluster.image_store import built_or_none
from cluster.kubelet import CHECKOUT, NodeAgent, node_unavailable
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server
from helpers.kubectl import KUBECTL, Kubectl, table_rows
from helpers.polling import wait_for
from helpers.sandbox_http import open_session, run
from helpers.seaweedfs import seaweedfs
from helpers.tiny_job import tiny_job_spec

from kuberl_sandbox.local import free_port
from kuberl_trainer.final_checkpoint import children_of
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable())),
]

NS = "default"
RLJOBS = f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs"
STEPS = 10
MODEL_URI = "s3://models/tiny"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """S3 with the tiny model in it, the emulated API server, a node agent and the operator; kubectl."""
    folder = tmp_path_factory.mktemp("e2e")
    sandbox_image = built_or_none("sandbox")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=4)
    with seaweedfs() as s3, emulated_api_server() as url:
        client = s3.client()
        for bucket in ("models", "checkpoints"):
            client.create_bucket(Bucket=bucket)
        for path in sorted(Path(model).iterdir()):
            client.upload_file(str(path), "models", f"tiny/{path.name}")
        s3_port = int(s3.endpoint.rsplit(":", 1)[1])
        # the pods' image would be the CPU build of the rollout image: vLLM's KV cache sized for a test
        local = {sandbox_image: sandbox_image} if sandbox_image else {}
        extra_env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
        with NodeAgent(url, folder / "node", host_ports=(s3_port,), extra_env=extra_env, local_images=local) as node:
            kubectl = Kubectl(url, folder, NS)
            environment = {
                "KUBERL_OPERATOR_INTERVAL": "1",
                "KUBERL_WATCH_SERVER_TIMEOUT": "60",
                "KUBERL_OPERATOR_METRICS_PORT": str(free_port()),
            }
            operator = OperatorProcess(kubectl.kubeconfig, folder / "operator.log", environment)
            operator.start([sys.executable, *HANDLERS])
            try:
                yield {
                    "api": Api(url),
                    "kubectl": kubectl,
                    "node": node,
                    "s3": s3,
                    "endpoint": f"http://{node.gateway}:{s3_port}",
                    "folder": folder,
                    "sandbox_image": sandbox_image,
                }
            finally:
                operator.stop()
                for log in sorted((folder / "node" / "logs").glob("*.log")):  # for a failure's report
                    print(f"==> {log.name}\n{log.read_text()[-3000:]}")
        assert not node.errors, node.errors


def manifest(cluster: dict[str, Any], name: str, steps: int = STEPS, **sections: dict[str, Any]) -> str:
    if cluster["sandbox_image"]:
        sections = {"sandbox": {"image": cluster["sandbox_image"]}, **sections}
    spec = tiny_job_spec(MODEL_URI, **sections)
    spec["training"]["totalSteps"] = steps
    spec["checkpoint"] = {
        "uri": f"s3://checkpoints/{name}",
        "endpointUrl": cluster["endpoint"],
        "credentialsSecret": "s3-credentials",
        "intervalSteps": 2,
        "keep": 3,
    }
    return yaml.safe_dump(
        {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}
    )


def status(api: Api, name: str) -> dict[str, Any]:
    return (api.get(f"{RLJOBS}/{name}") or {}).get("status") or {}


def learner_steps(folder: Path, job: str) -> list[int]:
    """The steps the learner logged (its stdout, as the node keeps it), in order."""
    lines = (folder / "node" / "logs" / f"{NS}_{job}-learner-0_learner.log").read_text().splitlines()
    return [json.loads(line)["step"] for line in lines if line.startswith('{"step"')]


def pod(api: Api, name: str) -> dict[str, Any]:
    return api.get(f"/api/v1/namespaces/{NS}/pods/{name}") or {}


def scrape(obj: dict[str, Any], port_name: str) -> str:
    """A pod's /metrics, from the node (as Prometheus reaches it): its IP, its container port of that name."""
    ports = {p["name"]: p["containerPort"] for c in obj["spec"]["containers"] for p in c.get("ports") or []}
    url = f"http://{obj['status']['podIP']}:{ports[port_name]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def apply_credentials(cluster: dict[str, Any]) -> None:
    """The Secret the jobs name in spec.checkpoint.credentialsSecret."""
    s3 = cluster["s3"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-credentials"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    }
    cluster["kubectl"]("apply", "-f", "-", stdin=json.dumps(secret))


def checkpoint_store(cluster: dict[str, Any], uri: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The job's checkpoints in S3, read from the test's side."""
    s3 = cluster["s3"]
    for key, value in {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
    }.items():
        monkeypatch.setenv(key, value)
    from kuberl_trainer.checkpoints.store import CheckpointStore

    return CheckpointStore(uri)


def is_ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_apply_train_lose_a_rollout_pod_succeed_and_delete(cluster, monkeypatch):
    """Two scenarios in one job, to fit the time: apply -> Running -> steps -> Succeeded at
    training.totalSteps with the checkpoint in S3, and a rollout pod deleted mid-run -> replaced, with no
    training step lost or repeated."""
    api, kubectl, folder = cluster["api"], cluster["kubectl"], cluster["folder"]
    began = time.monotonic()
    apply_credentials(cluster)
    path = folder / "e2e.yaml"
    path.write_text(manifest(cluster, "e2e"))
    assert kubectl("apply", "-f", str(path)).strip() == "rljob.kuberl.io/e2e created"

    wait_for("e2e Running", lambda: status(api, "e2e").get("phase") == "Running", 300)
    running_s = time.monotonic() - began
    wait_for("step 2 in the status", lambda: (status(api, "e2e").get("step") or 0) >= 2, 240)
    (row,) = [r for r in table_rows(kubectl("get", "rlj")) if r["NAME"] == "e2e"]
    assert row["PHASE"] == "Running" and int(row["STEP"]) >= 2
    # every tier's /metrics where the chart's PodMonitor scrapes it: the pod IP and the named port
    sandbox = next(
        p["metadata"]["name"] for p in api.items(f"/api/v1/namespaces/{NS}/pods") if "sandbox" in p["metadata"]["name"]
    )
    for name, port in (("e2e-learner-0", "metrics"), ("e2e-rollout-0", "http"), (sandbox, "http")):
        assert "# TYPE kuberl_" in scrape(pod(api, name), port), name
    if cluster["sandbox_image"]:
        assert_sandbox_from_its_image(cluster, sandbox)

    # a rollout pod lost mid-run: its StatefulSet replaces it, the learner waits for it, no step is lost
    lost = pod(api, "e2e-rollout-0")["metadata"]["uid"]
    kubectl("delete", "pod", "e2e-rollout-0", "--wait=false")
    replaced = wait_for(
        "a new e2e-rollout-0, ready",
        lambda: (p := pod(api, "e2e-rollout-0")) and p["metadata"]["uid"] != lost and is_ready(p),
        240,
    )
    assert replaced
    replaced_s = time.monotonic() - began

    final = wait_for(
        "e2e finished",
        lambda: status(api, "e2e") if status(api, "e2e").get("phase") in ("Succeeded", "Failed", "Stopped") else None,
        300,
    )
    print(
        f"Running after {running_s:.0f} s, rollout pod replaced at {replaced_s:.0f} s, done after "
        f"{time.monotonic() - began:.0f} s"
    )
    assert (final["phase"], final.get("reason")) == ("Succeeded", "Completed"), json.dumps(final)
    assert final["step"] == STEPS
    assert learner_steps(folder, "e2e") == list(range(1, STEPS + 1))  # none lost, none repeated
    learner = pod(api, "e2e-learner-0")["status"]["containerStatuses"][0]
    assert learner["restartCount"] == 0

    # the checkpoint the status names is complete in S3, and the trained policy is exported beside it (the
    # learner's run folder is an emptyDir, gone with its pod when the operator scales the job to zero)
    checkpoint = final["lastCheckpoint"]
    assert (checkpoint["step"], checkpoint["uri"]) == (STEPS, "s3://checkpoints/e2e")
    store = checkpoint_store(cluster, checkpoint["uri"], monkeypatch)
    assert STEPS in [m.step for m in store.complete()]
    assert store.backend.list_files("policy")["model.safetensors"] > 0
    assert (
        '"policy": "s3://checkpoints/e2e/policy"'
        in (folder / "node" / "logs" / f"{NS}_e2e-learner-0_learner.log").read_text()
    )

    # the learner reported with its service account's rights only (the operator's Role for it)
    node = cluster["node"]
    seen = {(method, url.split("?")[0]) for _, method, url in node.network.relays.requests}
    assert ("PATCH", f"{RLJOBS}/e2e/status") in seen  # the audit saw the learner's reports
    assert node.refused_requests() == []

    (row,) = [r for r in table_rows(kubectl("get", "rlj")) if r["NAME"] == "e2e"]
    assert (row["PHASE"], row["STEP"]) == ("Succeeded", str(STEPS))
    assert list(row) == ["NAME", "PHASE", "STEP", "REWARD", "AGE"]

    assert kubectl("delete", "rlj", "e2e").strip() == 'rljob.kuberl.io "e2e" deleted'
    wait_for("the job's pods gone", lambda: not api.items(f"/api/v1/namespaces/{NS}/pods"), 120)
    listed = kubectl("get", "statefulsets,deployments,services,configmaps,secrets", "-o", "name").split()
    assert not [n for n in listed if n.split("/")[1].startswith("e2e-")]


def assert_sandbox_from_its_image(cluster: dict[str, Any], name: str) -> None:
    """The sandbox pod runs the image's files (the checkout is out of its sight) and isolates a session as
    in production: the session's own unprivileged uid, and a network namespace with only its loopback."""
    node, obj = cluster["node"], pod(cluster["api"], name)
    assert obj["status"]["containerStatuses"][0]["image"] == cluster["sandbox_image"]
    root = node.container_root(name)
    assert (root / "opt" / "kuberl" / "bin" / "python3").exists() and not (root / str(CHECKOUT)[1:]).exists()
    runner = next(r for r in list(node.pods.values()) if r.name == name)
    token = runner.containers[0].env["KUBERL_SANDBOX_TOKEN"]
    url = f"http://{obj['status']['podIP']}:8700"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        sid = open_session(http, {"taskId": "isolation", "prompt": "p", "files": {"a.txt": "x\n"}})
        output = run(http, sid, "id -u; tail -n +3 /proc/net/dev | cut -d: -f1")["output"]
        http.delete(f"/v1/sessions/{sid}")
    uid, *interfaces = output.split()
    assert int(uid) != 0 and interfaces == ["lo"], output


def learner_runs(folder: Path, job: str) -> list[list[dict[str, Any]]]:
    """What the learner logged (its JSON lines), one list per start of its container, across its pods."""
    runs: list[list[dict[str, Any]]] = []
    for line in (folder / "node" / "logs" / f"{NS}_{job}-learner-0_learner.log").read_text().splitlines():
        if line.startswith("--- ") and " start " in line:  # the node's line at each container start
            runs.append([])
        elif line.startswith("{") and runs:
            with contextlib.suppress(ValueError):
                runs[-1].append(json.loads(line))
    return runs


def steps_of(run: list[dict[str, Any]]) -> list[int]:
    return [entry["step"] for entry in run if next(iter(entry)) == "step"]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def kill_learner_process(node: NodeAgent, pod_name: str) -> list[int]:
    """SIGKILL the learner's process (torchrun's worker, as the OOM killer would); returns its pids."""
    runner = next(r for r in list(node.pods.values()) if r.name == pod_name and not r.deleting.is_set())
    torchrun = runner.containers[0].pid1()  # the container's PID 1
    assert torchrun is not None
    workers = children_of(torchrun)
    assert workers, "torchrun has no worker"
    for pid in workers:
        os.kill(pid, signal.SIGKILL)
    return workers


def job_pods(api: Api, job: str) -> list[str]:
    names = [p["metadata"]["name"] for p in api.items(f"/api/v1/namespaces/{NS}/pods")]
    return [n for n in names if n.startswith(f"{job}-")]


def test_kill_the_learner_suspend_resume_and_stop_at_the_wall_clock(cluster, monkeypatch):
    """Three scenarios in one job, to fit the time: the learner's process killed -> its
    container restarts and resumes from the newest complete checkpoint in S3; suspended -> every pod gone
    after a final checkpoint, resumed -> training continues from it; a wall-clock limit -> Stopped with
    MaxWallClockReached and a final checkpoint. The limit is lowered on the running job (to one it has
    already used up), so the operator's backstop trips it: the learner read its spec when it started."""
    api, kubectl, folder, node = cluster["api"], cluster["kubectl"], cluster["folder"], cluster["node"]
    job = "recover"
    began = time.monotonic()
    apply_credentials(cluster)
    path = folder / f"{job}.yaml"
    path.write_text(manifest(cluster, job, steps=1000))
    kubectl("apply", "-f", str(path))
    store = checkpoint_store(cluster, f"s3://checkpoints/{job}", monkeypatch)
    timings: dict[str, float] = {}

    def newest() -> int:
        found = store.newest()
        return found.step if found else 0

    def merge(spec: dict[str, Any]) -> None:
        kubectl("patch", "rlj", job, "--type=merge", "-p", json.dumps({"spec": spec}))

    def checkpoint_in_status(step: int) -> bool:
        return ((status(api, job).get("lastCheckpoint") or {}).get("step")) == step

    wait_for(f"{job} Running", lambda: status(api, job).get("phase") == "Running", 300)
    timings["running"] = time.monotonic() - began

    # (1) the learner's process killed: torchrun (--max-restarts=0) exits, the kubelet restarts the container,
    # and the learner resumes from the newest complete checkpoint in S3 (its emptyDir run folder has none)
    wait_for("a checkpoint past step 0", lambda: (status(api, job).get("lastCheckpoint") or {}).get("step"), 240)

    def odd_step() -> bool:  # checkpoints are taken at even steps: none is being committed while we kill
        steps = steps_of(learner_runs(folder, job)[-1])
        return bool(steps) and steps[-1] >= 3 and steps[-1] % 2 == 1

    wait_for("the learner's log at an odd step", odd_step, 120, interval=0.05)
    killed = kill_learner_process(node, f"{job}-learner-0")
    wait_for("the learner process gone", lambda: not any(alive(pid) for pid in killed), 30)
    resume_from = newest()  # the learner is dead: nothing more is written
    assert resume_from >= 2
    runs = wait_for(
        "the learner restarted and trained a step",
        lambda: runs if len(runs := learner_runs(folder, job)) >= 2 and steps_of(runs[1]) else None,
        240,
    )
    first, second = steps_of(runs[0]), steps_of(runs[1])
    assert first == list(range(1, first[-1] + 1)) and first[-1] >= resume_from
    assert second[0] == resume_from + 1  # only the steps after the checkpoint are trained again
    assert pod(api, f"{job}-learner-0")["status"]["containerStatuses"][0]["restartCount"] == 1
    assert status(api, job)["phase"] == "Running"
    timings["resumed after the kill"] = time.monotonic() - began

    # (2) suspended: every tier to zero, the learner's preStop asks for a final checkpoint on the way down
    merge({"suspend": True})
    wait_for(f"{job} Suspended", lambda: status(api, job).get("phase") == "Suspended", 60)
    wait_for(f"the pods of {job} gone", lambda: not job_pods(api, job), 240)
    timings["suspended"] = time.monotonic() - began
    runs = learner_runs(folder, job)
    assert len(runs) == 2
    stop = next(e for e in runs[1] if "stopped" in e)
    suspended_at = stop["step"]
    assert steps_of(runs[1]) == list(range(resume_from + 1, suspended_at + 1)) and newest() == suspended_at
    wait_for("the final checkpoint in the status", lambda: checkpoint_in_status(suspended_at), 30)
    (row,) = [r for r in table_rows(kubectl("get", "rlj")) if r["NAME"] == job]
    assert row["PHASE"] == "Suspended"

    # resumed: the tiers come back and the learner continues from the final checkpoint
    merge({"suspend": False})
    wait_for(f"{job} Running again", lambda: status(api, job).get("phase") == "Running", 300)
    runs = wait_for(
        "the learner's first step after the resume",
        lambda: runs if len(runs := learner_runs(folder, job)) >= 3 and steps_of(runs[2]) else None,
        240,
    )
    assert steps_of(runs[2])[0] == suspended_at + 1
    timings["resumed after the suspension"] = time.monotonic() - began

    # (3) the wall-clock limit: Stopped, every tier to zero, the learner's final checkpoint on the way down
    merge({"limits": {"maxWallClock": "30s"}})
    final = wait_for(
        f"{job} stopped",
        lambda: status(api, job) if status(api, job).get("phase") in ("Succeeded", "Failed", "Stopped") else None,
        120,
    )
    assert (final["phase"], final.get("reason")) == ("Stopped", "MaxWallClockReached"), json.dumps(final)
    wait_for(f"the pods of {job} gone", lambda: not job_pods(api, job), 240)
    runs = learner_runs(folder, job)
    assert len(runs) == 3
    stop = next(e for e in runs[2] if "stopped" in e)
    assert steps_of(runs[2]) == list(range(suspended_at + 1, stop["step"] + 1)) and newest() == stop["step"]
    wait_for("the final checkpoint in the status", lambda: checkpoint_in_status(stop["step"]), 30)
    assert status(api, job)["reason"] == "MaxWallClockReached"
    timings["stopped"] = time.monotonic() - began
    print(", ".join(f"{what} after {seconds:.0f} s" for what, seconds in timings.items()))
    # this job's pods only: the audit judges each request by the RBAC there is now, and the first job's
    # Role went with it (its learner's requests were audited while it was there)
    assert [r for r in node.refused_requests() if r.startswith(f"{NS}:{job}-")] == []
    kubectl("delete", "rlj", job)
