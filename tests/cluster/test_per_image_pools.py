"""A job on SWE-bench-format instances that each name their own environment image, end to end.

As in test_end_to_end.py: the operator runs unchanged against the emulated API server, the test node agent
(tests/cluster/kubelet.py) runs its pods, SeaweedFS is the S3 store and a tiny Llama trains on CPU. The
instances name two instance images built without KubeRL (tests/helpers/instance_images.py: semver and
inflection at /testbed) and one image no registry has. The operator keeps a sandbox pool per image; a pool
pod's init container, from KubeRL's sandbox image, copies the server bundle onto an emptyDir and the instance
image's container runs it (kuberl/portable_server.py), so an episode's workspace is its image's /testbed. The
missing image's pod waits in ErrImagePull/ImagePullBackOff: the operator marks the image unusable in
status.sandboxPools, its episodes end as errors that are left out of training, and the job completes.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from cluster.image_store import built_or_none
from cluster.kubelet import NodeAgent, node_unavailable
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server
from helpers.kubectl import KUBECTL, Kubectl
from helpers.polling import wait_for
from helpers.sandbox_http import open_session, run
from helpers.seaweedfs import seaweedfs
from helpers.tiny_job import tiny_job_spec

from kuberl.api.sandbox_images import pool_key, pool_service_name
from kuberl.api.swebench import SWEBenchInstance
from kuberl.swebench.instances import instance_task
from kuberl_sandbox.local import free_port
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable())),
]

NS = "default"
JOB = "pools"
RLJOBS = f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs"
PODS = f"/api/v1/namespaces/{NS}/pods"
STEPS = 3  # enough for the learner to read status.sandboxPools again after the image turned unusable
MODEL_URI = "s3://models/tiny"
TASKS_URI = "s3://models/tasks/instances.jsonl"
MISSING_IMAGE = "localhost/kuberl-tests/swe-missing:0"  # in no local storage, built by no Dockerfile
POOL_LABEL = "kuberl.io/sandbox-pool"
PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff")
# what each instance image's /testbed holds at its base commit: the bug its instance asks to fix
BUGGY_LINES = {
    "python-semver/python-semver": ("src/semver/version.py", "self._minor, self._patch + 2)"),
    "jpvanhal/inflection": ("inflection/__init__.py", "return word.replace('_', '')"),
}


def instance_rows_or_skip() -> list[dict[str, Any]]:
    """The instance rows with their images (built once), or a skip where this machine cannot build images."""
    from helpers.built_images import can_build, missing_tools

    if missing := missing_tools():
        pytest.skip(f"instance images need {', '.join(missing)}")
    if reason := can_build():
        pytest.skip(reason)
    from helpers.instance_images import instance_rows

    return instance_rows()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """S3 with the tiny model and the instances, the emulated API server, a node agent that runs the
    sandbox image and both instance images from local storage, and the operator."""
    rows = instance_rows_or_skip()
    sandbox_image = built_or_none("sandbox")
    assert sandbox_image, "the instance images were built, so the sandbox image can be"
    missing = dict(rows[0], instance_id="python-semver__python-semver-404", image=MISSING_IMAGE)
    rows = [dict(row, split="train") for row in (missing, *rows)]  # the missing image's task drawn first
    folder = tmp_path_factory.mktemp("pools")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=4)
    (folder / "instances.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    with seaweedfs() as s3, emulated_api_server() as url:
        client = s3.client()
        for bucket in ("models", "checkpoints"):
            client.create_bucket(Bucket=bucket)
        for path in sorted(Path(model).iterdir()):
            client.upload_file(str(path), "models", f"tiny/{path.name}")
        client.upload_file(str(folder / "instances.jsonl"), "models", TASKS_URI.removeprefix("s3://models/"))
        s3_port = int(s3.endpoint.rsplit(":", 1)[1])
        local = {image: image for image in {sandbox_image, *(row["image"] for row in rows[1:])}}
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
                    "rows": rows,
                }
            finally:
                operator.stop()
                for log in sorted((folder / "node" / "logs").glob("*.log")):  # for a failure's report
                    print(f"==> {log.name}\n{log.read_text()[-3000:]}")
        assert not node.errors, node.errors


def manifest(cluster: dict[str, Any]) -> str:
    spec = tiny_job_spec(
        MODEL_URI,
        environment={"name": "swe-bench", "tasks": {"uri": TASKS_URI, "split": "train", "evalSplit": "train"}},
        reward={"function": "swe-bench-resolved"},
        sandbox={"image": cluster["sandbox_image"], "pools": {"claimTimeout": "30s"}},
    )
    spec["training"]["totalSteps"] = STEPS
    spec["checkpoint"] = {
        "uri": f"s3://checkpoints/{JOB}",
        "endpointUrl": cluster["endpoint"],
        "credentialsSecret": "s3-credentials",
        "intervalSteps": 100,
        "keep": 1,
    }
    return yaml.safe_dump(
        {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": JOB}, "spec": spec}
    )


def apply_credentials(cluster: dict[str, Any]) -> None:
    s3 = cluster["s3"]
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "s3-credentials"},
        "stringData": {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
    }
    cluster["kubectl"]("apply", "-f", "-", stdin=json.dumps(secret))


def status(api: Api) -> dict[str, Any]:
    return (api.get(f"{RLJOBS}/{JOB}") or {}).get("status") or {}


def pools(api: Api) -> dict[str, dict[str, Any]]:
    """status.sandboxPools by image."""
    return {p["image"]: p for p in status(api).get("sandboxPools") or []}


def pool_pods(api: Api, image: str) -> list[dict[str, Any]]:
    return [
        p
        for p in api.items(PODS)
        if (p["metadata"].get("labels") or {}).get(POOL_LABEL) == pool_key(image)
        and not p["metadata"].get("deletionTimestamp")
    ]


def ready_pool_pod(api: Api, image: str) -> dict[str, Any] | None:
    for p in pool_pods(api, image):
        conditions = (p.get("status") or {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            return p
    return None


def learner_log(folder: Path) -> list[dict[str, Any]]:
    """The learner's JSON lines (its stdout, as the node keeps it)."""
    path = folder / "node" / "logs" / f"{NS}_{JOB}-learner-0_learner.log"
    entries = []
    for line in path.read_text().splitlines():
        if line.startswith("{"):
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
    return entries


def assert_session_in_its_image(cluster: dict[str, Any], pod: dict[str, Any], row: dict[str, Any]) -> None:
    """The pool pod ran the bundle its init container copied, inside the instance image, and a session's
    workspace is the image's /testbed (the bug its instance names), its commands on the image's own Python."""
    node, name = cluster["node"], pod["metadata"]["name"]
    (installer,) = pod["status"]["initContainerStatuses"]
    assert installer["image"] == cluster["sandbox_image"]
    assert installer["state"]["terminated"]["reason"] == "Completed"
    (server,) = pod["status"]["containerStatuses"]
    assert server["image"] == row["image"] and "running" in server["state"]
    root = node.container_root(name)
    assert (root / "testbed").is_dir() and (root / "kuberl" / "python").is_dir()
    assert not (root / "opt" / "kuberl").exists()  # the sandbox image's own installation is not there
    runner = next(r for r in list(node.pods.values()) if r.name == name and not r.deleting.is_set())
    token = runner.containers[0].env["KUBERL_SANDBOX_TOKEN"]
    task = instance_task(SWEBenchInstance.model_validate(row)).model_dump(mode="json", by_alias=True)
    path, line = BUGGY_LINES[row["repo"]]
    url = f"http://{pod['status']['podIP']}:8700"
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        sid = open_session(http, task)
        try:
            output = run(http, sid, f"grep -cF {line!r} {path}; command -v python")["output"]
        finally:
            http.delete(f"/v1/sessions/{sid}")
    assert output.split() == ["1", "/opt/venv/bin/python"], output


def test_a_pool_per_image_runs_the_bundled_server_and_a_missing_image_is_masked(cluster):
    api, kubectl, folder = cluster["api"], cluster["kubectl"], cluster["folder"]
    good = cluster["rows"][1:]  # the first names the missing image
    began = time.monotonic()
    apply_credentials(cluster)
    path = folder / f"{JOB}.yaml"
    path.write_text(manifest(cluster))
    kubectl("apply", "-f", str(path))
    wait_for(f"{JOB} Running", lambda: status(api).get("phase") == "Running", 300)
    timings = {"running": time.monotonic() - began}

    # a pool per image, each a Deployment and Service named for its image
    for row in good:
        pod = wait_for(f"a ready pool pod of {row['image']}", lambda row=row: ready_pool_pod(api, row["image"]), 240)
        assert pod["metadata"]["name"].startswith(pool_service_name(JOB, row["image"]) + "-")
        assert_session_in_its_image(cluster, pod, row)
    timings["pools ready"] = time.monotonic() - began

    # the missing image: its pod never pulls it, the operator says so and marks it unusable
    unusable = wait_for(
        "the missing image unusable",
        lambda: (p := pools(api).get(MISSING_IMAGE)) and p.get("unusable") and p,
        240,
    )
    assert unusable["reason"] in PULL_FAILURES, unusable
    assert MISSING_IMAGE in (unusable.get("message") or ""), unusable
    assert unusable["pool"] == pool_service_name(JOB, MISSING_IMAGE)
    assert not any(pools(api)[row["image"]].get("unusable") for row in good if row["image"] in pools(api))
    timings["unusable"] = time.monotonic() - began

    final = wait_for(
        f"{JOB} finished",
        lambda: status(api) if status(api).get("phase") in ("Succeeded", "Failed", "Stopped") else None,
        600,
    )
    timings["done"] = time.monotonic() - began
    print(", ".join(f"{what} after {seconds:.0f} s" for what, seconds in timings.items()))
    assert (final["phase"], final.get("reason")) == ("Succeeded", "Completed"), json.dumps(final)
    assert final["step"] == STEPS
    log = learner_log(folder)
    steps = [e for e in log if "step" in e and "loss" in e]
    assert [e["step"] for e in steps] == list(range(1, STEPS + 1))
    assert all(e["trajectories"] >= 1 for e in steps)
    # the missing image's task was drawn first: its episodes ended as errors naming the image (never trained:
    # the learner leaves failed episodes out), then the learner left the task out of its draws
    logs = folder / "node" / "logs"
    rollout = (logs / f"{NS}_{JOB}-rollout-0_rollout.log").read_text()
    missing_task = f"episode of task {cluster['rows'][0]['instance_id']} "
    errors = [line for line in rollout.splitlines() if line.startswith(missing_task)]
    assert errors and all(f"no sandbox for image {MISSING_IMAGE}" in line for line in errors), errors
    learner = (logs / f"{NS}_{JOB}-learner-0_learner.log").read_text()
    assert f"1 of 3 training tasks left out: their sandbox images are unusable ({MISSING_IMAGE} (" in learner
    assert kubectl("delete", "rlj", JOB).strip() == f'rljob.kuberl.io "{JOB}" deleted'
    wait_for("the job's pods gone", lambda: not api.items(PODS), 180)
