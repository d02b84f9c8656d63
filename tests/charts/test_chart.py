"""charts/kuberl: it lints, renders valid Kubernetes for 1.30 and the newest release, rejects wrong values by
name, runs the operator as PSS *restricted*, and grants it exactly what it needs (no wildcards) in both RBAC
modes. Everything runs offline with `helm template`; nothing here talks to a cluster."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from conftest import BIN, EXAMPLES, REPO, tool

from kuberl.api.rljob import RLJob
from kuberl.crd import GROUP, PLURAL
from kuberl.kube import collection_path
from kuberl.validation import load_rljob
from kuberl_operator.config import OperatorConfig
from kuberl_operator.desired import desired_objects
from kuberl_operator.images import JobImages
from kuberl_operator.meta import JOB_LABEL, MANAGED_BY, ROLLOUT, TIER_LABEL
from kuberl_operator.network_policy import NetworkPeers, build_rollout_network_policy
from kuberl_operator.rbac import role_rules
from kuberl_operator.sandbox import build_sandbox_deployment
from kuberl_operator.security import SandboxPodSecurity

CHART = REPO / "charts" / "kuberl"
ALL_ON = Path(__file__).with_name("values-all-on.yaml")
MONITORING_SCHEMA = json.loads(Path(__file__).with_name("prometheus-operator.schema.json").read_text())
HELM = str(BIN / "helm") if (BIN / "helm").exists() else shutil.which("helm")
RELEASE, NAMESPACE = "kuberl", "kuberl-system"
OLDEST, NEWEST = "1.30", kubernetes_validate.utils.latest_version()
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")
CLUSTER_SCOPED = {("", "nodes"), ("", "namespaces"), ("apiextensions.k8s.io", "customresourcedefinitions")}
CHILD_VERBS = {"get", "create", "patch", "delete"}

# The operator's rules on namespaced resources, as the operator's brief lists them (kuberl.io group first).
NAMESPACED_RULES = {
    (GROUP, "rljobs"): {"get", "list", "watch", "patch", "update"},
    (GROUP, "rljobs/status"): {"get", "patch", "update"},
    (GROUP, "rljobs/finalizers"): {"update"},
    ("", "pods"): {"get", "list", "watch", "delete"},
    ("", "events"): {"create", "patch"},
    **{("", r): CHILD_VERBS for r in ("configmaps", "secrets", "services", "serviceaccounts")},
    ("apps", "statefulsets"): CHILD_VERBS,
    ("apps", "deployments"): CHILD_VERBS | {"list"},  # a job's per-image sandbox pools, by its labels
    **{("extensions.agents.x-k8s.io", r): CHILD_VERBS | {"list"} for r in ("sandboxtemplates", "sandboxwarmpools")},
    ("policy", "poddisruptionbudgets"): CHILD_VERBS,
    ("networking.k8s.io", "networkpolicies"): CHILD_VERBS,
    **{("rbac.authorization.k8s.io", r): CHILD_VERBS for r in ("roles", "rolebindings")},
    ("autoscaling", "horizontalpodautoscalers"): CHILD_VERBS,
}
KUEUE_RULES = {
    ("kueue.x-k8s.io", "workloads"): {"get", "list", "watch", "create", "patch", "delete"},
    ("kueue.x-k8s.io", "workloads/status"): {"get"},
}
CRD_RULES = {("apiextensions.k8s.io", "customresourcedefinitions"): {"get", "list", "watch"}}
NODE_RULES = {("", "nodes"): {"get", "list", "watch"}}
NAMESPACE_RULES = {("", "namespaces"): {"list", "watch"}}


# ------------------------------------------------------------------------------ helpers
def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    assert HELM, "helm is missing: run `make install` (it puts helm 3.17 into .venv/bin)"
    result = subprocess.run([HELM, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result


def render(*args: str, chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` of the chart (CRDs included) as a list of objects."""
    out = helm("template", RELEASE, str(chart), "-n", NAMESPACE, "--include-crds", *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = of_kind(objects, kind)
    return found


def grants(role: dict[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(apiGroup, resource) -> verbs of a Role or ClusterRole, merged over its rules."""
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def operator_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [container] = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    return container


def job_objects() -> list[dict[str, Any]]:
    """What the operator creates for every example RLJob (kuberl render)."""
    return [o for path in EXAMPLES for o in desired_objects(load_rljob(str(path)), "team", owner=None)]


def group_and_resource(api_version: str, kind: str) -> tuple[str, str]:
    """From the operator's own REST paths: `/api/v1/namespaces/NS/pods` -> ("", "pods")."""
    path = collection_path(api_version, kind, "ns")
    group = "" if path.startswith("/api/") else api_version.split("/")[0]
    return group, path.rsplit("/", 1)[1]


@pytest.fixture(scope="module")
def default() -> list[dict[str, Any]]:
    return render()


@pytest.fixture(scope="module")
def all_on() -> list[dict[str, Any]]:
    """Every option on; watchNamespaces set, so RBAC is namespaced."""
    return render("-f", str(ALL_ON))


@pytest.fixture(scope="module")
def all_on_cluster_wide() -> list[dict[str, Any]]:
    return render("-f", str(ALL_ON), "--set-json", "watchNamespaces=[]")


RENDERS = ("default", "all_on", "all_on_cluster_wide")


# ------------------------------------------------------------------------------ chart metadata and CRDs
def test_chart_metadata_follows_the_project():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert (chart["apiVersion"], chart["name"], chart["version"]) == ("v2", "kuberl", "0.1.0")
    assert chart["appVersion"] == version, "Chart.yaml appVersion must be kuberl's version in pyproject.toml"
    assert chart["kubeVersion"] == ">=1.30.0-0"


def test_the_chart_crd_is_a_byte_identical_copy_of_crds():
    source, chart_copy = REPO / "crds" / "rljob.yaml", CHART / "crds" / "rljob.yaml"
    assert chart_copy.read_bytes() == source.read_bytes(), (
        "charts/kuberl/crds/rljob.yaml differs from crds/rljob.yaml: run `make crds` (it writes both)"
    )
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["rljob.yaml"]


def test_kubernetes_older_than_1_30_is_refused():
    result = helm("template", RELEASE, str(CHART), "--kube-version", "1.29.9", check=False)
    assert result.returncode != 0 and ">=1.30.0-0" in result.stderr


# ------------------------------------------------------------------------------ lint and valid objects
@pytest.mark.parametrize("values", [[], ["-f", str(ALL_ON)]], ids=["default", "all-on"])
def test_helm_lint_strict_passes(values):
    result = helm("lint", "--strict", str(CHART), "-n", NAMESPACE, *values)
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
@pytest.mark.parametrize("rendered", RENDERS)
def test_every_built_in_object_is_valid_kubernetes(rendered, version, request):
    # kubernetes-validate --strict: unknown fields are errors, as they are for the API server's strict decoding
    for obj in request.getfixturevalue(rendered):
        if obj["kind"] in MONITORING_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(
                f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                f"{'.'.join(map(str, err.path))}: {err.message}"
            )


@pytest.mark.parametrize("rendered", RENDERS)
def test_prometheus_operator_objects_match_the_fields_they_use(rendered, request):
    # kubernetes-validate knows no CRD kinds; prometheus-operator.schema.json types the fields the chart uses
    for obj in request.getfixturevalue(rendered):
        if obj["kind"] in MONITORING_KINDS:
            jsonschema.validate(obj, {**MONITORING_SCHEMA, "$ref": f"#/definitions/{obj['kind']}"})


def test_the_monitoring_schema_rejects_a_misspelt_field(all_on):
    monitor = copy.deepcopy(one(all_on, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["honourLabels"] = True
    with pytest.raises(jsonschema.ValidationError, match="honourLabels"):
        jsonschema.validate(monitor, {**MONITORING_SCHEMA, "$ref": "#/definitions/ServiceMonitor"})


def test_what_renders_by_default_and_with_everything_on(default, all_on, all_on_cluster_wide):
    def kinds(objects):
        return sorted(o["kind"] for o in objects)

    assert kinds(default) == sorted(
        ["CustomResourceDefinition", "ServiceAccount", "Deployment", "Service"]
        + ["ClusterRole", "ClusterRoleBinding"] * 2
    )
    dashboards = len(list((CHART / "files" / "dashboards").glob("*.json")))
    monitoring = ["ServiceMonitor", "PodMonitor", "PrometheusRule"] + ["ConfigMap"] * dashboards
    base = ["CustomResourceDefinition", "ServiceAccount", "Deployment", "Service", *monitoring]
    base += ["NetworkPolicy"] * 2  # networkPolicy.defaultDeny: the namespace's default deny, the metrics one
    assert kinds(all_on) == sorted([*base, "ClusterRole", "ClusterRoleBinding"] + ["Role", "RoleBinding"] * 2)
    assert kinds(all_on_cluster_wide) == sorted(base + ["ClusterRole", "ClusterRoleBinding"] * 2)


# ------------------------------------------------------------------------------ values and their schema
@pytest.mark.parametrize(
    ("values", "named"),
    [
        (["--set", "replicaCount=2"], "replicaCount"),
        (["--set", "image.pullPolicy=Sometimes"], "image.pullPolicy"),
        (["--set", "watchNamespaces={Bad_NS}"], "watchNamespaces.0"),
        (["--set", "replcaCount=1"], "replcaCount"),
        (["--set", "serviceMonitor.enabled=yes"], "serviceMonitor.enabled"),
        (["--set", "serviceMonitor.intervl=30s"], "intervl"),
        (["--set", "operator.workers=0"], "operator.workers"),
        (["--set", "podMonitor.tiers={learner,gateway}"], "podMonitor.tiers.1"),
        (["--set", "podLabels.app\\.kubernetes\\.io/component=x"], "podLabels"),
        (["--set", "operator.sandboxAppArmorProfile=docker-default"], "operator.sandboxAppArmorProfile"),
        (["--set", "networkPolicy.monitoringNamespace=Monitoring"], "networkPolicy.monitoringNamespace"),
        (["--set", "networkPolicy.defaultDeny=yes"], "networkPolicy.defaultDeny"),
        (["--set", "image.registry=https://registry.example.com"], "image.registry"),
        (["--set", "image.tag=1.0+local"], "image.tag"),
        (["--set", "imagePullSecrets[0].name=Reg_Cred"], "imagePullSecrets.0.name"),
        (["--set", "jobDefaults.imageRegistry=registry.example.com/team/"], "jobDefaults.imageRegistry"),
        (["--set", "jobDefaults.imagePullSecrets[0].nme=regcred"], "nme"),
        (["--set", "image.repository=operator:0.1.0"], "image.repository"),
    ],
    ids=[
        "two-replicas",
        "pull-policy",
        "bad-namespace",
        "typo-top-level",
        "string-bool",
        "typo-nested",
        "no-workers",
        "unknown-tier",
        "selector-label",
        "apparmor-notation",
        "bad-monitoring-namespace",
        "string-default-deny",
        "registry-with-scheme",
        "plus-in-tag",
        "bad-pull-secret",
        "registry-trailing-slash",
        "pull-secret-typo",
        "tag-in-repository",
    ],
)
def test_wrong_values_are_rejected_naming_the_value(values, named):
    result = helm("template", RELEASE, str(CHART), *values, check=False)
    assert result.returncode != 0, f"{values} was accepted"
    assert "don't meet the specifications of the schema" in result.stderr
    assert re.search(rf"(^|\W){re.escape(named)}\W", result.stderr), result.stderr


def test_replica_count_says_why_it_must_be_one():
    schema = json.loads((CHART / "values.schema.json").read_text())
    replicas = schema["properties"]["replicaCount"]
    assert (replicas["minimum"], replicas["maximum"]) == (1, 1)
    assert "peering" in replicas["description"]


def test_every_value_is_commented_and_in_the_schema():
    # every key down to the second level has a comment above it (or, for an object, above its first child);
    # deeper keys (resources.requests.cpu) are what their parent's comment describes
    schema = json.loads((CHART / "values.schema.json").read_text())
    lines = (CHART / "values.yaml").read_text().splitlines()
    for i, line in enumerate(lines):
        key = re.match(r"^( {0,2})[A-Za-z]\w*:", line)
        if not key:
            continue
        commented_above = i > 0 and lines[i - 1].strip().startswith("#")
        commented_child = line.rstrip().endswith(":") and lines[i + 1].strip().startswith("#")
        assert commented_above or commented_child, f"values.yaml line {i + 1}: `{line.strip()}` has no comment"
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], props: dict[str, Any], path: str) -> None:
        for name, value in node.items():
            assert name in props, f"values.schema.json has no {path}{name}"
            assert props[name].get("description"), f"values.schema.json: {path}{name} has no description"
            if isinstance(value, dict) and "properties" in props[name]:
                walk(value, props[name]["properties"], f"{path}{name}.")

    walk(values, schema["properties"], "")
    assert schema["additionalProperties"] is False
    objects = [p for p in schema["properties"].values() if "properties" in p]
    assert all(p["additionalProperties"] is False for p in objects)


# ------------------------------------------------------------------------------ the operator Deployment
def test_one_replica_replaced_by_recreate(default, all_on):
    for objects in (default, all_on):
        spec = one(objects, "Deployment")["spec"]
        assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}


def test_the_operator_runs_kuberl_operator_cluster_wide_by_default(default):
    container = operator_container(default)
    assert container["command"] == ["kuberl", "operator"]
    assert container["args"] == ["--liveness", "http://0.0.0.0:8080/healthz", "--metrics-port", "9300"]
    assert container["image"] == "ghcr.io/kuberl/operator:0.1.0"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["KUBERL_OPERATOR_INTERVAL"] == "3" and env["KUBERL_OPERATOR_WORKERS"] == "32"
    assert env["KUBERL_OPERATOR_WATCH_NODES"] == "1"
    assert env["KUBERL_OPERATOR_SANDBOX_USER_NAMESPACE"] == "1"
    assert env["KUBERL_OPERATOR_SANDBOX_APPARMOR_PROFILE"] == env["KUBERL_OPERATOR_SANDBOX_SECCOMP_PROFILE"] == ""


@pytest.mark.parametrize("rendered", ["default", "all_on"])
def test_the_sandbox_pod_values_reach_the_sandbox_pods_the_operator_renders(rendered, request):
    # the chart's env, read as the operator reads it, shapes every job's sandbox Deployment
    env = {e["name"]: e["value"] for e in operator_container(request.getfixturevalue(rendered))["env"]}
    security = SandboxPodSecurity.from_env(env)
    job = load_rljob(str(REPO / "examples" / "swe-toy.yaml"))
    pod = build_sandbox_deployment(job, "team", None, "token", security)["spec"]["template"]["spec"]
    [container] = pod["containers"]
    if rendered == "default":  # a user namespace, the nodes' default AppArmor profile: Pod Security baseline
        assert pod["hostUsers"] is False
        assert "appArmorProfile" not in container["securityContext"]
    else:  # values-all-on.yaml: a cluster without user namespaces, with a profile of its own on the nodes
        assert "hostUsers" not in pod
        assert container["securityContext"]["appArmorProfile"] == {
            "type": "Localhost",
            "localhostProfile": "kuberl-sandbox",
        }


def test_watch_namespaces_become_one_dash_n_each(all_on):
    container = operator_container(all_on)
    assert container["args"][4:] == ["-n", "rl-team-a", "-n", "rl-team-b", "-v"]
    assert container["image"] == "registry.example.com/kuberl/operator:0.1.0-rc.1"
    assert container["imagePullPolicy"] == "Always"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["KUBERL_OPERATOR_INTERVAL"] == "5" and env["KUBERL_OPERATOR_WORKERS"] == "64"


# ------------------------------------------------------------------------------ images and registries
PRIVATE = "registry.example.com/team"


def job_images(objects: list[dict[str, Any]]) -> JobImages:
    """The job image defaults the rendered operator runs with, read as `kuberl operator` reads them."""
    return OperatorConfig.from_env({e["name"]: e["value"] for e in operator_container(objects)["env"]}).job_images


def test_out_of_the_box_every_image_is_the_releases_on_ghcr(default):
    assert operator_container(default)["image"] == "ghcr.io/kuberl/operator:0.1.0"
    assert "imagePullSecrets" not in one(default, "Deployment")["spec"]["template"]["spec"]
    assert job_images(default) == JobImages(registry="ghcr.io/kuberl", tag="0.1.0", pull_secrets=())


def test_a_private_registry_moves_the_operator_and_every_job_image():
    # the docs/helm.md recipe: `make images PUSH=...`, then these values
    objects = render(
        "--set",
        f"image.registry={PRIVATE}",
        "--set",
        "imagePullSecrets[0].name=regcred",
        "--set",
        "jobDefaults.imagePullSecrets[0].name=regcred",
    )
    for obj in objects:  # kubernetes-validate --strict, as for the built-in renders
        kubernetes_validate.validate(obj, NEWEST, strict=True)
    assert operator_container(objects)["image"] == f"{PRIVATE}/operator:0.1.0"
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    images = job_images(objects)
    assert images == JobImages(registry=PRIVATE, tag="0.1.0", pull_secrets=("regcred",))
    # what that operator creates for a job that names no image, and for one with a pull secret of its own
    manifest = yaml.safe_load((REPO / "examples" / "swe-toy.yaml").read_text())
    manifest["spec"].setdefault("learner", {})["imagePullSecrets"] = [{"name": "learner-pull"}, {"name": "regcred"}]
    children = desired_objects(RLJob.from_manifest(manifest), "team", owner=None, images=images)
    for obj in children:
        kubernetes_validate.validate(obj, NEWEST, strict=True)
    pods = {
        o["metadata"]["labels"][TIER_LABEL]: o["spec"]["template"]["spec"]
        for o in children
        if o["kind"] in ("StatefulSet", "Deployment")
    }
    assert {t: p["containers"][0]["image"] for t, p in pods.items()} == {
        t: f"{PRIVATE}/{t}:0.1.0" for t in ("learner", "rollout", "sandbox")
    }
    assert pods["learner"]["imagePullSecrets"] == [{"name": "learner-pull"}, {"name": "regcred"}]
    assert pods["rollout"]["imagePullSecrets"] == pods["sandbox"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_job_defaults_can_point_elsewhere_than_the_operator_image(all_on):
    # values-all-on.yaml: the operator from one repository, the jobs' images from another, with their own tag
    assert operator_container(all_on)["image"] == "registry.example.com/kuberl/operator:0.1.0-rc.1"
    assert job_images(all_on) == JobImages(
        registry="registry.example.com/rl-images", tag="0.1.0-rc.2", pull_secrets=("regcred", "rl-images-pull")
    )


@pytest.mark.parametrize(
    ("values", "image"),
    [
        (["--set", "image.repository=registry.example.com/kuberl/operator"], "registry.example.com/kuberl/operator"),
        (["--set", "image.repository=localhost:5000/operator"], "localhost:5000/operator"),
        (["--set", "image.registry=", "--set", "image.repository=kuberl/operator"], "kuberl/operator"),
        (["--set", "image.registry=registry.example.com:5000/team"], "registry.example.com:5000/team/operator"),
    ],
    ids=["repository-with-host", "localhost-with-port", "no-registry", "registry-with-port"],
)
def test_a_repository_that_names_its_registry_is_used_as_it_is(values, image):
    assert operator_container(render(*values))["image"] == f"{image}:0.1.0"


def test_probes_and_ports(default):
    container = operator_container(default)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 8080, "http-metrics": 9300}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}


def test_placement_values_reach_the_pod(all_on):
    pod = one(all_on, "Deployment")["spec"]["template"]
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["tolerations"][0]["key"] == "dedicated" and "nodeAffinity" in spec["affinity"]
    assert spec["priorityClassName"] == "kuberl-critical"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["metadata"]["labels"]["team"] == "platform"
    assert pod["metadata"]["annotations"] == {"example.com/scrape": "false"}
    assert operator_container(all_on)["resources"]["limits"] == {"cpu": "2", "memory": "1Gi"}


@pytest.mark.parametrize("rendered", RENDERS)
def test_the_operator_pod_is_pss_restricted(rendered, request):
    pod = one(request.getfixturevalue(rendered), "Deployment")["spec"]["template"]["spec"]
    container = operator_container(request.getfixturevalue(rendered))
    security = {**pod["securityContext"], **container["securityContext"]}
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 65532
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert security["readOnlyRootFilesystem"] is True
    [tmp] = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    assert not any(k in pod for k in ("hostNetwork", "hostPID", "hostIPC"))


# ------------------------------------------------------------------------------ RBAC
@pytest.mark.parametrize("rendered", RENDERS)
def test_no_rbac_rule_uses_a_wildcard(rendered, request):
    for role in [o for o in request.getfixturevalue(rendered) if o["kind"] in ("Role", "ClusterRole")]:
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames", "nonResourceURLs"):
                assert "*" not in rule.get(field, []), f"{role['kind']}/{role['metadata']['name']}: {rule}"


def test_cluster_wide_mode_grants_exactly_the_listed_rules(default):
    [namespaced] = [r for r in of_kind(default, "ClusterRole") if r["metadata"]["name"] == "kuberl"]
    [cluster] = [r for r in of_kind(default, "ClusterRole") if r["metadata"]["name"] == "kuberl-cluster"]
    assert grants(namespaced) == NAMESPACED_RULES
    assert grants(cluster) == {**CRD_RULES, **NAMESPACE_RULES, **NODE_RULES}
    bindings = {b["roleRef"]["name"]: b["subjects"] for b in of_kind(default, "ClusterRoleBinding")}
    subject = [{"kind": "ServiceAccount", "name": "kuberl", "namespace": NAMESPACE}]
    assert bindings == {"kuberl": subject, "kuberl-cluster": subject}
    assert not of_kind(default, "Role") and not of_kind(default, "RoleBinding")


def test_namespaced_mode_grants_namespaced_resources_only_in_the_watched_namespaces(all_on):
    roles = {r["metadata"]["namespace"]: r for r in of_kind(all_on, "Role")}
    assert sorted(roles) == ["rl-team-a", "rl-team-b"]
    assert all(grants(r) == {**NAMESPACED_RULES, **KUEUE_RULES} for r in roles.values())
    for binding in of_kind(all_on, "RoleBinding"):
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kuberl"}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl-operator", "namespace": NAMESPACE}]
    # the only ClusterRole holds cluster-scoped reads; kopf lists namespaces only when serving all of them
    [cluster] = of_kind(all_on, "ClusterRole")
    assert set(grants(cluster)) <= CLUSTER_SCOPED
    assert grants(cluster) == {**CRD_RULES, **NODE_RULES}


def test_kueue_and_nodes_are_granted_only_when_enabled(default, all_on_cluster_wide):
    assert not set(KUEUE_RULES) & {k for r in of_kind(default, "ClusterRole") for k in grants(r)}
    [namespaced] = [r for r in of_kind(all_on_cluster_wide, "ClusterRole") if r["metadata"]["name"] == "kuberl"]
    assert grants(namespaced) == {**NAMESPACED_RULES, **KUEUE_RULES}
    no_nodes = render("--set", "rbac.nodes=false")
    assert ("", "nodes") not in {k for r in of_kind(no_nodes, "ClusterRole") for k in grants(r)}
    # without the grant the operator must not start its node watch: a forbidden list would stall it
    env = {e["name"]: e["value"] for e in operator_container(no_nodes)["env"]}
    assert env["KUBERL_OPERATOR_WATCH_NODES"] == "0"


def test_rbac_and_service_account_can_be_left_to_the_cluster_admin():
    objects = render(
        "--set",
        "rbac.create=false",
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=kuberl-admin-made",
    )
    assert {o["kind"] for o in objects} == {"CustomResourceDefinition", "Deployment", "Service"}
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "kuberl-admin-made"


def test_the_operator_may_create_everything_it_creates_for_a_job(all_on):
    # what the operator builds for the examples (Kueue Workloads included), against the Role the chart renders
    granted = grants(of_kind(all_on, "Role")[0])
    created = {group_and_resource(o["apiVersion"], o["kind"]) for o in job_objects()}
    created |= {("", "secrets")}  # the sandbox token Secret, created once outside the desired state
    for key in created:
        assert granted.get(key, set()) >= CHILD_VERBS, f"the chart does not let the operator manage {key}"


def test_the_operator_holds_every_permission_of_the_learner_roles_it_creates(default):
    # Kubernetes lets a subject create a Role (and bind it) only if it holds the Role's permissions itself
    [role] = [r for r in of_kind(default, "ClusterRole") if r["metadata"]["name"] == "kuberl"]
    granted = grants(role)
    for rule in role_rules(load_rljob(str(EXAMPLES[0]))):
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                assert set(rule["verbs"]) <= granted[group, resource], (group, resource)
    assert (GROUP, PLURAL) in granted


# ------------------------------------------------------------------------------ network policies
def test_the_namespace_default_deny_renders_only_when_turned_on(default, all_on):
    assert of_kind(default, "NetworkPolicy") == []
    policies = {p["metadata"]["name"]: p for p in of_kind(all_on, "NetworkPolicy")}
    assert set(policies) == {"kuberl-default-deny", "kuberl-metrics"}
    assert all(p["metadata"]["namespace"] == NAMESPACE for p in policies.values())
    # every pod of the namespace, ingress only, no rule: nothing gets in that another policy does not admit
    assert policies["kuberl-default-deny"]["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


def test_with_default_deny_prometheus_still_reaches_the_operator_metrics_port_only(all_on):
    metrics = next(p for p in of_kind(all_on, "NetworkPolicy") if p["metadata"]["name"] == "kuberl-metrics")
    operator_pod = one(all_on, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert metrics["spec"]["podSelector"]["matchLabels"].items() <= operator_pod.items()
    assert metrics["spec"]["podSelector"] == one(all_on, "Deployment")["spec"]["selector"]
    ports = {p["name"]: p["containerPort"] for p in operator_container(all_on)["ports"]}
    assert metrics["spec"]["ingress"] == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": ports["http-metrics"]}],
        }
    ]


def test_without_a_monitoring_namespace_default_deny_admits_nothing():
    objects = render("--set", "networkPolicy.defaultDeny=true", "--set", "networkPolicy.monitoringNamespace=")
    [policy] = of_kind(objects, "NetworkPolicy")
    assert policy["metadata"]["name"] == "kuberl-default-deny"
    env = {e["name"]: e["value"] for e in operator_container(objects)["env"]}
    assert env["KUBERL_OPERATOR_MONITORING_NAMESPACE"] == ""


@pytest.mark.parametrize(
    "values",
    [[], ["--set", "nameOverride=rl", "--set", "fullnameOverride=ops", "--set", "podLabels.team=x"]],
    ids=["default", "overridden-names"],
)
def test_the_jobs_rollout_pods_admit_the_operator_as_the_chart_deploys_it(values):
    # the chart's env, read as the operator reads it, names the namespace and the Prometheus namespace the jobs'
    # policies admit; the operator pod's labels satisfy the rollout policy's peer whatever the names
    objects = render(*values, "--set", "networkPolicy.monitoringNamespace=prom")
    env = {e["name"]: e["value"] for e in operator_container(objects)["env"]}
    peers = NetworkPeers.from_env(env)
    assert peers == NetworkPeers(operator_namespace=NAMESPACE, monitoring_namespace="prom")
    job = load_rljob(str(REPO / "examples" / "swe-toy.yaml"))
    policy = build_rollout_network_policy(job, "team", None, peers)
    [operator_peer] = [p for r in policy["spec"]["ingress"] for p in r["from"] if "podSelector" in p and len(p) == 2]
    assert operator_peer["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}
    operator_pod = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert operator_peer["podSelector"]["matchLabels"].items() <= operator_pod.items()
    # ... and no job pod carries them (job pods' component label is their tier)
    for obj in job_objects():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert not operator_peer["podSelector"]["matchLabels"].items() <= labels.items()
    assert policy["metadata"]["labels"][TIER_LABEL] == ROLLOUT


# ------------------------------------------------------------------------------ monitoring
def test_the_metrics_service_and_service_monitor_reach_the_operator(all_on):
    service, monitor = one(all_on, "Service"), one(all_on, "ServiceMonitor")
    assert service["spec"]["ports"] == [
        {"name": "http-metrics", "port": 9300, "targetPort": "http-metrics", "protocol": "TCP"}
    ]
    selector = service["spec"]["selector"]
    assert selector.items() <= one(all_on, "Deployment")["spec"]["template"]["metadata"]["labels"].items()
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http-metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the job metrics carry their own `namespace` label
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_pod_monitor_scrapes_the_job_tiers_with_rljob_and_tier_labels(all_on, all_on_cluster_wide):
    monitor = one(all_on, "PodMonitor")
    assert monitor["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": MANAGED_BY}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["rl-team-a", "rl-team-b"]}
    assert one(all_on_cluster_wide, "PodMonitor")["spec"]["namespaceSelector"] == {"any": True}
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert set(endpoints) == {"metrics", "http"}
    pod_label = {
        label: "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)
        for label in (JOB_LABEL, TIER_LABEL)
    }
    for endpoint in endpoints.values():
        assert endpoint["path"] == "/metrics"
        assert {"sourceLabels": [pod_label[JOB_LABEL]], "targetLabel": "rljob"} in endpoint["relabelings"]
        assert {"sourceLabels": [pod_label[TIER_LABEL]], "targetLabel": "tier"} in endpoint["relabelings"]
    # the port names are the ones the operator gives its containers, per tier
    ports_by_tier: dict[str, set[str]] = {}
    for obj in job_objects():
        if obj["kind"] in ("StatefulSet", "Deployment"):
            tier = obj["metadata"]["labels"][TIER_LABEL]
            for container in obj["spec"]["template"]["spec"]["containers"]:
                ports_by_tier.setdefault(tier, set()).update(p["name"] for p in container.get("ports", []))
            assert obj["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/managed-by"] == MANAGED_BY
    assert "metrics" in ports_by_tier["learner"] and "http" not in ports_by_tier["learner"]
    assert "http" in ports_by_tier["rollout"] and "http" in ports_by_tier["sandbox"]
    # only rank 0 (pod 0) of the learner serves metrics
    keep = endpoints["metrics"]["relabelings"][0]
    assert keep["action"] == "keep" and re.fullmatch(keep["regex"], "learner;swe-gpu-learner-0")
    assert not re.fullmatch(keep["regex"], "learner;swe-gpu-learner-1")
    assert endpoints["http"]["relabelings"][0] == {
        "sourceLabels": [pod_label[TIER_LABEL]],
        "regex": "rollout|sandbox",
        "action": "keep",
    }


def test_the_pod_monitor_scrapes_only_the_chosen_tiers():
    monitor = one(
        render("--set", "podMonitor.enabled=true", "--set", "podMonitor.tiers={learner,rollout}"), "PodMonitor"
    )
    endpoints = {e["port"]: e for e in monitor["spec"]["podMetricsEndpoints"]}
    assert endpoints["http"]["relabelings"][0]["regex"] == "rollout"
    only_rollout = render("--set", "podMonitor.enabled=true", "--set", "podMonitor.tiers={rollout}")
    assert [e["port"] for e in one(only_rollout, "PodMonitor")["spec"]["podMetricsEndpoints"]] == ["http"]


def test_the_prometheus_rule_is_files_alerts_yaml(all_on, tmp_path):
    alerts = yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    rule = one(all_on, "PrometheusRule")
    assert rule["spec"]["groups"] == alerts["groups"]
    # promtool checks the file, and the groups as the chart renders them
    promtool = tool("promtool")
    assert shutil.which(promtool), "promtool is missing: run `make install` (it installs Debian's prometheus)"
    rendered = tmp_path / "rendered-rules.yaml"
    rendered.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    for path in (CHART / "files" / "alerts.yaml", rendered):
        result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


def test_one_dashboard_config_map_per_json_file_for_the_grafana_sidecar(all_on, default):
    files = sorted((CHART / "files" / "dashboards").glob("*.json"))
    assert files, "charts/kuberl/files/dashboards/ holds no dashboard"
    maps = of_kind(all_on, "ConfigMap")
    assert len(maps) == len(files)
    by_file = {name: m for m in maps for name in m["data"]}
    for path in files:
        dashboard = json.loads(path.read_text())
        assert dashboard["title"] and dashboard["uid"]
        config_map = by_file[path.name]
        assert config_map["data"] == {path.name: path.read_text()}  # as it is: {{ }} in legends stay
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "KubeRL"}
        assert config_map["metadata"]["namespace"] == "monitoring"
    assert not of_kind(default, "ConfigMap")
    custom = render(
        "--set",
        "dashboards.enabled=true",
        "--set",
        "dashboards.label=team_dashboard",
        "--set-string",
        "dashboards.labelValue=yes",
    )
    assert all(m["metadata"]["labels"]["team_dashboard"] == "yes" for m in of_kind(custom, "ConfigMap"))
    assert all("annotations" not in m["metadata"] for m in of_kind(custom, "ConfigMap"))


# ------------------------------------------------------------------------------ NOTES.txt
def rendered_notes(tmp_path: Path, *values: str) -> str:
    """NOTES.txt as `helm install` prints it: `helm template` skips it, so a copy of the chart renders the same
    text into a ConfigMap (same engine, same values)."""
    chart = tmp_path / "kuberl"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "NOTES.txt").unlink()
    (chart / "templates" / "_notes.tpl").write_text('{{- define "test.notes" -}}\n' + notes + "{{- end -}}\n")
    (chart / "templates" / "notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\n"
        'data:\n  notes: {{ include "test.notes" . | toJson }}\n'
    )
    [config_map] = [o for o in render(*values, chart=chart) if o["metadata"]["name"] == "notes"]
    return config_map["data"]["notes"]


def test_notes_say_what_to_do_next(tmp_path):
    notes = rendered_notes(tmp_path)
    for expected in (
        "kubectl -n kuberl-system get pods",
        "kubectl apply -n default -f examples/minimal.yaml",
        "kubectl get rlj -A -w",
        "helm uninstall kuberl -n kuberl-system",
        "kubectl apply -f crds/rljob.yaml",
        "every namespace (cluster-wide)",
    ):
        assert expected in notes, f"NOTES.txt lacks {expected!r}:\n{notes}"
    assert "never deletes the RLJob CRD" in " ".join(notes.split())


def test_notes_say_which_images_run_and_how_to_use_a_registry_of_your_own(tmp_path):
    notes = " ".join(rendered_notes(tmp_path).split())
    assert "the operator runs ghcr.io/kuberl/operator:0.1.0" in notes
    assert "ghcr.io/kuberl/learner, ghcr.io/kuberl/rollout and ghcr.io/kuberl/sandbox, tag 0.1.0" in notes
    for step in ("make images PUSH=registry.example.com/team", "--set image.registry=registry.example.com/team"):
        assert step in notes
    private = " ".join(rendered_notes(tmp_path / "all-on", "-f", str(ALL_ON)).split())
    assert "registry.example.com/rl-images/learner" in private and "make images" not in private
    assert "pulled with the Secrets regcred, rl-images-pull" in private
    assert "create secret docker-registry regcred --docker-server=registry.example.com" in private


def test_notes_name_the_watched_namespaces_and_the_monitoring_objects(tmp_path):
    notes = rendered_notes(tmp_path, "-f", str(ALL_ON))
    assert "the namespaces rl-team-a, rl-team-b" in notes
    assert "kubectl apply -n rl-team-a -f examples/minimal.yaml" in notes
    for expected in (
        "ServiceMonitor kuberl",
        "PodMonitor kuberl-jobs",
        "PrometheusRule kuberl",
        "grafana_dashboard=1",
        'folder "KubeRL"',
    ):
        assert expected in notes
