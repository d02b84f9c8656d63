"""The operator as the Helm chart deploys it: `helm template | kubectl apply`, the node agent runs the
operator's Deployment as a pod from the operator's real image (built once by tests/helpers/built_images.py;
the checkout stands in where this machine cannot build images): uid 65532, read-only root filesystem,
in-cluster credentials over TLS, its probes pass, and it reconciles a job applied with kubectl."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from cluster.image_store import built_or_none
from cluster.kubelet import NodeAgent, node_unavailable
from conftest import BIN, REPO
from helpers.emulator import Api, emulated_api_server
from helpers.kubectl import KUBECTL, Kubectl
from helpers.polling import wait_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed"),
    pytest.mark.skipif(not (BIN / "helm").exists(), reason="helm is not installed (make install)"),
    pytest.mark.skipif(node_unavailable() is not None, reason=str(node_unavailable())),
]

SYSTEM = "kuberl-system"


@pytest.fixture(scope="module")
def operator_image() -> str | None:
    return built_or_none("operator")


@pytest.fixture
def cluster(tmp_path, operator_image) -> Iterator[tuple[Api, Kubectl, NodeAgent]]:
    local = {operator_image: operator_image} if operator_image else {}
    with emulated_api_server() as url, NodeAgent(url, tmp_path / "node", local_images=local) as node:
        try:
            yield Api(url), Kubectl(url, tmp_path, "default"), node
        finally:
            for log in sorted((tmp_path / "node" / "logs").glob("*.log")):  # for a failure's report
                print(f"==> {log.name}\n{log.read_text()[-3000:]}")
        assert not node.errors, node.errors


def ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def test_the_charts_operator_pod_starts_and_reconciles_a_job(cluster, operator_image):
    api, kubectl, node = cluster
    values = []
    if operator_image:  # the chart's image values name the local image; it is never pulled
        repository, tag = operator_image.rsplit(":", 1)
        values = ["--set", f"image.repository={repository}", "--set", f"image.tag={tag}"]
        values += ["--set", "image.pullPolicy=Never"]
    rendered = subprocess.run(
        [str(BIN / "helm"), "template", "kuberl", str(REPO / "charts" / "kuberl"), "--namespace", SYSTEM, *values],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    kubectl("apply", "-f", "-", stdin=rendered)
    pods = f"/api/v1/namespaces/{SYSTEM}/pods"
    (pod,) = wait_for("the operator pod ready", lambda: [p for p in api.items(pods) if ready(p)], 120)
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0, json.dumps(status)
    if operator_image:  # the image's own files are its root: the checkout is out of its sight
        assert status["image"] == operator_image
        root = node.container_root(pod["metadata"]["name"])
        assert (root / "etc" / "os-release").is_file() and not (root / str(REPO).lstrip("/")).exists()

    job = (REPO / "examples" / "minimal.yaml").read_text() + "  suspend: true\n"  # children, but no pods
    kubectl("apply", "-f", "-", stdin=job)
    rljob = "/apis/kuberl.io/v1alpha1/namespaces/default/rljobs/minimal"
    wait_for("minimal Suspended", lambda: ((api.get(rljob) or {}).get("status") or {}).get("phase") == "Suspended", 60)
    assert {s["metadata"]["name"] for s in api.items("/apis/apps/v1/namespaces/default/statefulsets")} == {
        "minimal-learner",
        "minimal-rollout",
    }
    assert kubectl("delete", "rlj", "minimal").strip() == 'rljob.kuberl.io "minimal" deleted'  # waits for kopf
    assert not api.items("/apis/apps/v1/namespaces/default/statefulsets")
    # everything the operator did, it did with the permissions the chart grants it
    seen = {(method, url.split("?")[0]) for _, method, url in node.network.relays.requests}
    assert ("PATCH", "/apis/apps/v1/namespaces/default/statefulsets/minimal-learner") in seen  # the audit saw it
    assert node.refused_requests() == []
