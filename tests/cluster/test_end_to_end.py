"""From `kubectl apply` to a trained policy, with the operator's own pods running for real (issue 19).

The operator runs unchanged (`kuberl operator`) against the emulated API server; the test node agent
(tests/cluster/kubelet.py) runs the pods it creates, each in its own network namespace, from the very
commands, environment, volumes, Service names and probes the builders render; SeaweedFS is the S3 store;
the real `kubectl` drives it all as a user would. A tiny Llama trains for a few steps on CPU.
What this stands in for, and what it does not model, is in docs/operator.md ("The end-to-end suite").
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster.kubelet import NodeAgent, node_unavailable
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server
from helpers.kubectl import KUBECTL, Kubectl, table_rows
from helpers.polling import wait_for
from helpers.seaweedfs import seaweedfs
from helpers.tiny_job import tiny_job_spec

from kuberl.modeling.tiny import build_tiny_model
from kuberl_sandbox.local import free_port

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
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=4)
    with seaweedfs() as s3, emulated_api_server() as url:
        client = s3.client()
        for bucket in ("models", "checkpoints"):
            client.create_bucket(Bucket=bucket)
        for path in sorted(Path(model).iterdir()):
            client.upload_file(str(path), "models", f"tiny/{path.name}")
        s3_port = int(s3.endpoint.rsplit(":", 1)[1])
        # the pods' image would be the CPU build of the rollout image: vLLM's KV cache sized for a test
        with NodeAgent(url, folder / "node", host_ports=(s3_port,), extra_env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as node:
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
                }
            finally:
                operator.stop()
                for log in sorted((folder / "node" / "logs").glob("*.log")):  # for a failure's report
                    print(f"==> {log.name}\n{log.read_text()[-3000:]}")
        assert not node.errors, node.errors


def manifest(name: str, endpoint: str, **sections: dict[str, Any]) -> str:
    spec = tiny_job_spec(MODEL_URI, **sections)
    spec["training"]["totalSteps"] = STEPS
    spec["checkpoint"] = {
        "uri": f"s3://checkpoints/{name}",
        "endpointUrl": endpoint,
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


def is_ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_apply_train_lose_a_rollout_pod_succeed_and_delete(cluster, monkeypatch):
    """Two of the issue's scenarios in one job, to fit the time: apply -> Running -> steps -> Succeeded at
    training.totalSteps with the checkpoint in S3, and a rollout pod deleted mid-run -> replaced, with no
    training step lost or repeated."""
    api, kubectl, folder = cluster["api"], cluster["kubectl"], cluster["folder"]
    began = time.monotonic()
    s3 = cluster["s3"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-credentials"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(secret))
    path = folder / "e2e.yaml"
    path.write_text(manifest("e2e", cluster["endpoint"]))
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
    for key, value in {
        "AWS_ENDPOINT_URL": s3.endpoint,
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
    }.items():
        monkeypatch.setenv(key, value)
    from kuberl_trainer.checkpoints.store import CheckpointStore

    store = CheckpointStore(checkpoint["uri"])
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
