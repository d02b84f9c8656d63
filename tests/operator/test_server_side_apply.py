"""The operator writes its children with server-side apply under one field manager, against the emulated API
server (tests/helpers/emulator.py): what the requests carry, that re-applying writes nothing, that fields
another controller manages stay its own, and that the operator's configuration is fixed at start-up."""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from helpers.emulator import Api, emulated_api_server, write_kubeconfig
from kubernetes import config as kube_config

from kuberl.api.rljob import RLJob
from kuberl.kube import Kube, object_path
from kuberl_operator.apply import CREATE_ONLY, FIELD_MANAGER, apply_children
from kuberl_operator.config import OperatorConfig
from kuberl_operator.desired import desired_objects
from kuberl_operator.handlers import register
from kuberl_operator.meta import owner_reference
from kuberl_operator.security import SandboxPodSecurity

NS = "default"
APPLY_PATCH = "application/apply-patch+yaml"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
STATEFULSETS = f"/apis/apps/v1/namespaces/{NS}/statefulsets"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Kube]]:
    with emulated_api_server() as url:
        kubeconfig = write_kubeconfig(tmp_path_factory.mktemp("ssa") / "kubeconfig", url, NS)
        yield Api(url), Kube(kube_config.new_client_from_config(str(kubeconfig)))


def rljob(name: str, **spec: Any) -> RLJob:
    return RLJob.model_validate({"metadata": {"name": name, "namespace": NS}, "spec": spec})


def stored(api: Api, job: RLJob) -> dict[str, dict[str, Any]]:
    """'Kind/name' -> the stored object, for every child the job has (the token Secrets included)."""
    out = {}
    for obj in desired_objects(job, NS, owner=None):
        out[f"{obj['kind']}/{obj['metadata']['name']}"] = api.get(object_path(obj))
    for secret in (f"{job.name}-sandbox-token", f"{job.name}-job-token"):
        out[f"Secret/{secret}"] = api.get(f"/api/v1/namespaces/{NS}/secrets/{secret}")
    return out


class RecordingApiClient:
    """Stands in for kubernetes.client.ApiClient: records each call, answers an empty object."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []

    def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
        self.calls.append((method, path, kwargs))
        return SimpleNamespace(data=b"{}")


def test_an_apply_is_a_patch_with_the_apply_content_type_the_field_manager_and_force():
    recorder = RecordingApiClient()
    obj = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "j-learner", "namespace": NS}}
    Kube(recorder).apply(obj, FIELD_MANAGER)  # type: ignore[arg-type]
    Kube(recorder).apply(obj, "someone-else", force=False)  # type: ignore[arg-type]
    (method, path, call), (_, unforced, _) = recorder.calls
    assert method == "PATCH"
    assert path == f"{STATEFULSETS}/j-learner?fieldManager=kuberl-operator&force=true"
    assert call["header_params"]["Content-Type"] == APPLY_PATCH and call["body"] == obj
    assert unforced == f"{STATEFULSETS}/j-learner?fieldManager=someone-else"


def test_every_child_but_the_create_only_ones_is_applied_under_the_operators_field_manager(server):
    api, kube = server
    job = rljob("ssa")
    written = apply_children(kube, job, NS, "uid-ssa", scaled_down=False, new=True)
    children = stored(api, job)
    assert sorted(written) == sorted(children) and all(children.values())
    for name, obj in children.items():
        managers = obj["metadata"].get("managedFields") or []
        if name.split("/")[0] in CREATE_ONLY:
            assert managers == [], name  # created once (POST), never applied
        else:
            assert managers == [{"manager": "kuberl-operator", "operation": "Apply", "apiVersion": obj["apiVersion"]}]
            assert obj["metadata"]["ownerReferences"] == [owner_reference(job, "uid-ssa")], name
            assert obj["metadata"]["uid"], name  # the server's, as on a create


def test_applying_again_writes_nothing(server):
    api, kube = server
    job = rljob("again")
    apply_children(kube, job, NS, "uid-again", scaled_down=False, new=True)
    versions = {name: obj["metadata"]["resourceVersion"] for name, obj in stored(api, job).items()}
    # what a restarted operator does: read, find every field in place, write nothing
    assert apply_children(kube, job, NS, "uid-again", scaled_down=False) == []
    # and an apply of an unchanged object is no write on the server either (no new resourceVersion)
    for obj in desired_objects(job, NS, owner=owner_reference(job, "uid-again")):
        kube.apply(obj, FIELD_MANAGER)
    assert {name: obj["metadata"]["resourceVersion"] for name, obj in stored(api, job).items()} == versions


def test_a_changed_spec_is_applied_to_the_objects_it_changes_only(server):
    api, kube = server
    job = rljob("grow")
    apply_children(kube, job, NS, "uid-grow", scaled_down=False, new=True)
    before = stored(api, job)
    grown = rljob("grow", rollout={"replicas": 3})
    written = apply_children(kube, grown, NS, "uid-grow", scaled_down=False)
    assert "StatefulSet/grow-rollout" in written
    assert not {"ServiceAccount/grow-learner", "Service/grow-sandbox", "Deployment/grow-sandbox"} & set(written)
    assert api.get(f"{STATEFULSETS}/grow-rollout")["spec"]["replicas"] == 3
    after = stored(api, job)
    unchanged = [n for n in before if n not in written]
    assert all(after[n]["metadata"]["resourceVersion"] == before[n]["metadata"]["resourceVersion"] for n in unchanged)


def test_an_hpas_replicas_are_left_to_it(server):
    """The applied Deployment has no replicas while an HPA manages them: a spec change leaves the count the
    HPA chose; a scaled-down job takes them to zero."""
    api, kube = server
    job = rljob("hpa", sandbox={"autoscaler": "hpa", "minReplicas": 2, "maxReplicas": 8})
    apply_children(kube, job, NS, "uid-hpa", scaled_down=False, new=True)
    deployment = f"{DEPLOYMENTS}/hpa-sandbox"
    assert "replicas" not in api.get(deployment)["spec"]
    api.patch(deployment, {"spec": {"replicas": 5}})  # the HPA scales it (an update through the scale subresource)

    changed = rljob("hpa", sandbox={"autoscaler": "hpa", "minReplicas": 2, "maxReplicas": 6}, rollout={"replicas": 3})
    written = apply_children(kube, changed, NS, "uid-hpa", scaled_down=False)
    assert {"HorizontalPodAutoscaler/hpa-sandbox", "StatefulSet/hpa-rollout"} <= set(written)
    assert (
        api.get(f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/hpa-sandbox")["spec"]["maxReplicas"]
        == 6
    )
    assert api.get(deployment)["spec"]["replicas"] == 5

    apply_children(kube, changed, NS, "uid-hpa", scaled_down=True)
    assert api.get(deployment)["spec"]["replicas"] == 0


def test_the_operators_autoscaler_keeps_its_replicas_within_the_specs_bounds(server):
    api, kube = server
    job = rljob("own", sandbox={"minReplicas": 1, "maxReplicas": 8})
    apply_children(kube, job, NS, "uid-own", scaled_down=False, new=True)
    deployment = f"{DEPLOYMENTS}/own-sandbox"
    assert api.get(deployment)["spec"]["replicas"] == 1
    api.patch(deployment, {"spec": {"replicas": 6}})  # what reconcile.autoscale_sandbox writes
    apply_children(
        kube,
        rljob("own", sandbox={"minReplicas": 1, "maxReplicas": 8}, rollout={"replicas": 2}),
        NS,
        "uid-own",
        scaled_down=False,
    )
    assert api.get(deployment)["spec"]["replicas"] == 6
    apply_children(kube, rljob("own", sandbox={"minReplicas": 1, "maxReplicas": 4}), NS, "uid-own", scaled_down=False)
    assert api.get(deployment)["spec"]["replicas"] == 4


@pytest.mark.parametrize(
    ("query", "body", "message"),
    [
        ("", {}, "fieldManager is required"),
        ("?fieldManager=me", {"metadata": {"name": "x"}}, "apiVersion and kind"),
        ("?fieldManager=me", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "y"}}, "does not match"),
    ],
)
def test_the_emulator_refuses_an_apply_a_real_api_server_refuses(server, query, body, message):
    api, _ = server
    with pytest.raises(urllib.error.HTTPError) as err:
        api.call("PATCH", f"/api/v1/namespaces/{NS}/configmaps/x{query}", body, APPLY_PATCH)
    assert err.value.code == 400 and message in json.loads(err.value.read())["message"]
    assert api.get(f"/api/v1/namespaces/{NS}/configmaps/x") is None


def test_the_emulator_refuses_a_json_patch_whose_test_fails_with_422_as_a_real_api_server_does(server):
    """kopf removes its finalizer with a JSON patch that first tests the resourceVersion it saw; refused with
    422 it waits for its next event, as on a cluster (an answer of 500 would have it resend the same patch)."""
    api, _ = server
    path = f"/api/v1/namespaces/{NS}/configmaps/tested"
    api.post(
        f"/api/v1/namespaces/{NS}/configmaps", {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tested"}}
    )
    seen = api.get(path)["metadata"]["resourceVersion"]
    api.patch(path, {"data": {"moved": "on"}})  # a newer write: the resourceVersion moved on
    stale = [
        {"op": "test", "path": "/metadata/resourceVersion", "value": seen},
        {"op": "add", "path": "/metadata/labels", "value": {"late": "yes"}},
    ]
    with pytest.raises(urllib.error.HTTPError) as err:
        api.call("PATCH", path, stale, "application/json-patch+json")
    assert err.value.code == 422 and json.loads(err.value.read())["reason"] == "Invalid"
    assert "labels" not in api.get(path)["metadata"]


def test_the_configuration_comes_from_the_charts_variables_and_is_fixed_at_start_up():
    env = {
        "KUBERL_OPERATOR_INTERVAL": "1.5",
        "KUBERL_OPERATOR_AUTOSCALE_INTERVAL": "4",
        "KUBERL_OPERATOR_WORKERS": "64",
        "KUBERL_OPERATOR_WATCH_NODES": "0",
        "KUBERL_WATCH_SERVER_TIMEOUT": "60",
        "KUBERL_OPERATOR_SANDBOX_USER_NAMESPACE": "0",
    }
    config = OperatorConfig.from_env(env)
    assert config == OperatorConfig(
        interval_s=1.5,
        autoscale_interval_s=4.0,
        metrics_port=0,
        watch_nodes=False,
        workers=64,
        watch_server_timeout_s=60,
        sandbox_security=SandboxPodSecurity(user_namespace=False),
    )
    assert OperatorConfig.from_env({}) == OperatorConfig()

    registry = register(config)
    (timer,) = registry._spawning.get_all_handlers()
    assert timer.interval == 1.5 and timer.fn.keywords == {"config": config}
    assert [h.id for h in registry._indexing.get_all_handlers()] == ["pods_by_job"]  # no node watch
    assert {h.id for h in registry._changing.get_all_handlers()} == {"create", "apply", "apply/spec", "delete"}
    assert [h.id for h in register(OperatorConfig())._indexing.get_all_handlers()] == ["pods_by_job", "nodes_by_name"]
