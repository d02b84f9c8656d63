"""The real `kubectl` drives the operator against the emulated API server as a user drives a cluster: apply
an example job, read it by its short name with the CRD's printer columns, list what the operator created,
describe the job with its conditions and its own events, delete it and find its children gone.

One emulator and one operator process (`kuberl operator`) serve the module; kubectl runs as a subprocess
with a kubeconfig of its own (tests/helpers/kubectl.py). What the emulator does and does not do for kubectl
is in docs/operator.md.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import REPO
from helpers import polling
from helpers.emulator import HANDLERS, Api, OperatorProcess, emulated_api_server
from helpers.kubectl import KUBECTL, Kubectl, table_rows

from kuberl_sandbox.local import free_port

pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")

NS = "default"
MINIMAL = str(REPO / "examples" / "minimal.yaml")  # an RLJob named `minimal`
RLJOBS = f"/apis/kuberl.io/v1alpha1/namespaces/{NS}/rljobs"
TIMEOUT_S = 45.0  # generous: the 2 CPU cores may be shared with other work


def wait_for(what: str, check: Callable[[], Any], timeout: float = TIMEOUT_S) -> Any:
    return polling.wait_for(what, check, timeout)


def job(name: str, **spec: Any) -> str:
    """An RLJob manifest, as a user writes one (kubectl fills in the namespace)."""
    fields = "".join(f"\n  {key}: {value}" for key, value in {"model": "{uri: s3://models/tiny}", **spec}.items())
    return f"apiVersion: kuberl.io/v1alpha1\nkind: RLJob\nmetadata:\n  name: {name}\nspec:{fields}\n"


def children(kubectl: Kubectl, name: str) -> set[str]:
    """`kind/name` of every StatefulSet, Deployment, Service, ConfigMap and Secret of job `name`."""
    listed = kubectl("get", "statefulsets,deployments,services,configmaps,secrets", "-o", "name").split()
    return {n for n in listed if n.split("/")[1].startswith(f"{name}-")}


EXPECTED_CHILDREN = {
    "statefulset.apps/{job}-learner",
    "statefulset.apps/{job}-rollout",
    "deployment.apps/{job}-sandbox",
    "service/{job}-learner",
    "service/{job}-rollout",
    "service/{job}-sandbox",
    "configmap/{job}-config",
    "secret/{job}-sandbox-token",
    "secret/{job}-job-token",
}


def expected_children(name: str) -> set[str]:
    return {child.format(job=name) for child in EXPECTED_CHILDREN}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Kubectl]]:
    folder = tmp_path_factory.mktemp("kubectl")
    with emulated_api_server() as url:
        kubectl = Kubectl(url, folder, NS)
        environment = {
            "KUBERL_OPERATOR_INTERVAL": "1",
            "KUBERL_WATCH_SERVER_TIMEOUT": "60",
            "KUBERL_OPERATOR_METRICS_PORT": str(free_port()),
        }
        operator = OperatorProcess(kubectl.kubeconfig, folder / "operator.log", environment)
        operator.start([sys.executable, *HANDLERS])
        try:
            yield Api(url), kubectl
        finally:
            operator.stop()


@pytest.fixture(scope="module")
def minimal(cluster: tuple[Api, Kubectl]) -> str:
    """`kubectl apply -f examples/minimal.yaml`, once the operator has created every child; its output."""
    api, kubectl = cluster
    created = kubectl("apply", "-f", MINIMAL)
    wait_for("every child of minimal", lambda: children(kubectl, "minimal") == expected_children("minimal"))
    wait_for("minimal Initializing", lambda: (api.get(f"{RLJOBS}/minimal") or {}).get("status", {}).get("phase"))
    return created


def test_apply_creates_the_job_and_applying_it_again_changes_nothing(cluster, minimal):
    _, kubectl = cluster
    assert minimal.strip() == "rljob.kuberl.io/minimal created"
    assert kubectl("apply", "-f", MINIMAL).strip() == "rljob.kuberl.io/minimal unchanged"


def test_apply_refuses_a_field_the_crd_does_not_declare(cluster):
    _, kubectl = cluster
    typo = job("typo").replace("model:", "modle:")
    refused = kubectl.run("apply", "-f", "-", stdin=typo)
    assert refused.returncode == 1
    assert 'strict decoding error: unknown field "spec.modle"' in refused.stderr
    assert kubectl.run("get", "rlj", "typo").returncode == 1


def test_a_server_side_dry_run_validates_every_example_and_stores_nothing(cluster, minimal):
    _, kubectl = cluster
    printed = kubectl("apply", "--dry-run=server", "-f", str(REPO / "examples")).splitlines()
    assert len(printed) == len(list((REPO / "examples").glob("*.yaml")))
    assert "rljob.kuberl.io/minimal unchanged (server dry run)" in printed
    created = {line.split()[0] for line in printed if line.endswith(" created (server dry run)")}
    assert len(created) == len(printed) - 1  # the other examples
    assert not created & set(kubectl("get", "rlj", "-o", "name").split())


def test_get_by_short_name_and_category_prints_the_crds_printer_columns(cluster, minimal):
    api, kubectl = cluster
    # what the learner reports (its writer is tested in test_operator_kmock)
    api.patch(f"{RLJOBS}/minimal/status", {"status": {"step": 3, "rewardMean": 0.25}})
    (row,) = [r for r in table_rows(kubectl("get", "rlj")) if r["NAME"] == "minimal"]
    assert list(row) == ["NAME", "PHASE", "STEP", "REWARD", "AGE"]
    assert (row["PHASE"], row["STEP"], row["REWARD"]) == ("Initializing", "3", "0.25")
    assert row["AGE"].endswith(("s", "m"))
    (wide,) = table_rows(kubectl("get", "rlj", "minimal", "-o", "wide"))
    assert wide["REASON"] == "CreatingWorkers"  # priority 1: only in the wide output
    assert [r["NAME"] for r in table_rows(kubectl("get", "kuberl"))] == [
        r["NAME"] for r in table_rows(kubectl("get", "rlj"))
    ]
    resources = table_rows(kubectl("api-resources", "--api-group=kuberl.io"))
    assert resources == [
        {
            "NAME": "rljobs",
            "SHORTNAMES": "rlj",
            "APIVERSION": "kuberl.io/v1alpha1",
            "NAMESPACED": "true",
            "KIND": "RLJob",
        }
    ]


def test_lists_carry_their_kind(cluster, minimal):
    _, kubectl = cluster
    listed = kubectl.json("get", "rljobs.kuberl.io")
    assert ("RLJob", "minimal") in [(i["kind"], i["metadata"]["name"]) for i in listed["items"]]
    assert listed["kind"] == "List"  # kubectl's own wrapper, as against a cluster; the server's list is below
    rljobs = json.loads(kubectl("get", "--raw", RLJOBS))
    assert (rljobs["kind"], rljobs["apiVersion"]) == ("RLJobList", "kuberl.io/v1alpha1")
    services = json.loads(kubectl("get", "--raw", f"/api/v1/namespaces/{NS}/services"))
    assert (services["kind"], services["apiVersion"]) == ("ServiceList", "v1")


def test_get_services_and_the_workloads_the_operator_created(cluster, minimal):
    _, kubectl = cluster
    services = {r["NAME"]: r for r in table_rows(kubectl("get", "services"))}
    assert {"minimal-learner", "minimal-rollout", "minimal-sandbox"} <= set(services)
    assert services["minimal-learner"]["CLUSTER-IP"] == "None"  # headless: the learner ranks' per-pod names
    assert services["minimal-sandbox"]["PORT(S)"].endswith("/TCP")
    printed = table_rows(kubectl("get", "statefulsets,deployments,configmaps"))
    assert {r["NAME"] for r in printed} >= {
        "statefulset.apps/minimal-learner",
        "statefulset.apps/minimal-rollout",
        "deployment.apps/minimal-sandbox",
        "configmap/minimal-config",
    }
    learner = next(r for r in printed if r["NAME"] == "statefulset.apps/minimal-learner")
    assert learner["READY"] == "0/1"  # no kubelet here: no pod is ready
    assert "kuberl.io/job" in kubectl.json("get", "statefulset", "minimal-learner")["metadata"]["labels"]


def test_describe_shows_the_conditions_and_only_this_jobs_events(cluster, minimal):
    api, kubectl = cluster
    kubectl("apply", "-f", "-", stdin=job("broken", learner="{replicas: 0}"))  # the operator refuses it
    wait_for("broken refused", lambda: (api.get(f"{RLJOBS}/broken") or {}).get("status", {}).get("phase") == "Failed")
    described = kubectl("describe", "rlj", "minimal")
    assert "Name:         minimal" in described and "Kind:         RLJob" in described
    conditions = described.split("Conditions:")[1].split("Events:")[0]
    assert "Reason:                CreatingWorkers" in conditions
    events = described.split("Events:")[1]
    assert "CreatingWorkers" in events and "kuberl-operator" in events
    assert "InvalidSpec" not in events  # the other job's, left out by the field selector on involvedObject
    assert "InvalidSpec" in kubectl("describe", "rlj", "broken").split("Events:")[1]


def test_delete_removes_the_job_once_the_operator_has_removed_its_children(cluster):
    _, kubectl = cluster
    kubectl("apply", "-f", "-", stdin=job("doomed"))
    wait_for("every child of doomed", lambda: children(kubectl, "doomed") == expected_children("doomed"))
    # kubectl waits until the job is gone: the operator's finalizer holds it until the children are deleted
    assert kubectl("delete", "rlj", "doomed").strip() == 'rljob.kuberl.io "doomed" deleted'
    assert children(kubectl, "doomed") == set()
    gone = kubectl.run("get", "rlj", "doomed")
    assert gone.returncode == 1 and 'Error from server (NotFound): rljobs.kuberl.io "doomed" not found' in gone.stderr


def test_deleting_an_owner_deletes_what_it_owns_unless_orphaned(cluster):
    """The emulator's garbage collector, as a StatefulSet's pods need it (nothing here plays the StatefulSet
    controller, so the pods are created through the API with the owner reference it would set)."""
    api, kubectl = cluster
    for name in ("web", "kept"):
        statefulset = {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {}},
        }
        uid = api.post(f"/apis/apps/v1/namespaces/{NS}/statefulsets", statefulset)["metadata"]["uid"]
        owner = {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": name, "uid": uid, "controller": True}
        pod = {"name": f"{name}-0", "namespace": NS, "labels": {"app": name}, "ownerReferences": [owner]}
        api.post(f"/api/v1/namespaces/{NS}/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": pod})
    assert [r["NAME"] for r in table_rows(kubectl("get", "pods", "-l", "app in (web,kept)"))] == ["kept-0", "web-0"]
    kubectl("delete", "statefulset", "web")
    kubectl("delete", "statefulset", "kept", "--cascade=orphan")
    assert [r["NAME"] for r in table_rows(kubectl("get", "pods", "-l", "app in (web,kept)"))] == ["kept-0"]


def test_explain_reads_the_crds_schema(cluster):
    _, kubectl = cluster
    explained = kubectl("explain", "rlj.spec.model")
    assert "KIND:       RLJob" in explained and "uri\t<string>" in explained
