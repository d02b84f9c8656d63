"""The operator's child objects: valid Kubernetes for 1.30 and the newest schema kubernetes-validate knows,
for every example and for generated specs, with the security properties the design promises."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import EXAMPLES
from helpers.pod_security import pss_baseline_violations, with_container_context
from hypothesis import given, settings
from hypothesis import strategies as st

from kuberl.api.rljob import RLJob
from kuberl.api.spec import SandboxAutoscaler
from kuberl.validation import load_rljob
from kuberl_operator.desired import desired_objects, target_namespace
from kuberl_operator.images import JobImages
from kuberl_operator.job_config import resolved_job_manifest
from kuberl_operator.learner_gang import torchrun_argv
from kuberl_operator.meta import owner_reference
from kuberl_operator.placement import SPOT_NODE_LABELS
from kuberl_operator.secret import build_sandbox_token_secret
from kuberl_operator.security import (
    APPARMOR_ENV,
    SANDBOX_CAPABILITIES,
    SECCOMP_ENV,
    USER_NAMESPACE_ENV,
    SandboxPodSecurity,
    profile,
)
from kuberl_trainer.final_checkpoint import children_of

UID = "6f1c2a5e-0d4b-4c1e-9a53-1f2d3c4b5a69"
OLDEST, NEWEST = "1.30", kubernetes_validate.utils.latest_version()
WORKLOADS = ("StatefulSet", "Deployment")
WORKLOAD_OF = {
    "learner": ("StatefulSet", "learner"),
    "rollout": ("StatefulSet", "rollout"),
    "sandbox": ("Deployment", "sandbox"),
}


def render(job: RLJob, namespace: str | None = None) -> list[dict[str, Any]]:
    return desired_objects(job, target_namespace(job, namespace), owner=owner_reference(job, UID))


def by_kind(objects: list[dict[str, Any]], kind: str, tier: str | None = None) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind and tier in (None, o["metadata"]["labels"]["kuberl.io/tier"])]


def one(objects: list[dict[str, Any]], kind: str, tier: str) -> dict[str, Any]:
    [found] = by_kind(objects, kind, tier)
    return found


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def assert_valid_kubernetes(objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "Workload":
            assert_valid_kueue_workload(obj)
            continue
        for version in (OLDEST, NEWEST):
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(
                    f"{obj['kind']}/{obj['metadata']['name']} invalid for Kubernetes {version}: "
                    f"{'.'.join(map(str, err.path))}: {err.message}"
                )


def assert_valid_kueue_workload(workload: dict[str, Any]) -> None:
    """Kueue's Workload is a custom resource kubernetes-validate does not know: its shape is checked here, and
    each pod set's template, the bulk of it, is validated as the core PodTemplate it is."""
    assert workload["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert set(workload["spec"]) <= {"queueName", "podSets", "priorityClassName"}
    assert 1 <= len(workload["spec"]["podSets"]) <= 8  # Kueue's limit
    for pod_set in workload["spec"]["podSets"]:
        assert set(pod_set) == {"name", "count", "template"} and pod_set["count"] >= 1
        template = {
            "apiVersion": "v1",
            "kind": "PodTemplate",
            "template": pod_set["template"],
            "metadata": {"name": pod_set["name"], "namespace": workload["metadata"]["namespace"]},
        }
        assert_valid_kubernetes([template])


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request) -> RLJob:
    return load_rljob(str(request.param))


# ------------------------------------------------------------------------------ valid Kubernetes
def test_the_newest_schema_is_newer_than_the_oldest_supported():
    assert tuple(map(int, NEWEST.split(".")[:2])) > (1, 30)


def test_strict_validation_rejects_an_unknown_field(example):
    # guards the guard: a typo in a builder must fail the tests below
    statefulset = one(render(example), "StatefulSet", "learner")
    pod_spec(statefulset)["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(statefulset, OLDEST, strict=True)


def test_every_example_renders_valid_kubernetes(example):
    objects = render(example)
    assert_valid_kubernetes(objects)
    kinds = [o["kind"] for o in objects if o["kind"] != "Workload"]  # a queued job's (see below)
    assert kinds == [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "NetworkPolicy",
        "NetworkPolicy",
        "NetworkPolicy",
        "Service",
        "Service",
        "Service",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Deployment",
        "StatefulSet",
        "StatefulSet",
    ]


quantity = st.one_of(st.integers(0, 64), st.sampled_from(["500m", "1.5", "16Gi", "200Mi", "1e3"]))
capacity = st.sampled_from(["on-demand", "spot", "prefer-spot"])
label_value = st.from_regex(r"[a-z0-9]([a-z0-9.-]{0,20}[a-z0-9])?", fullmatch=True)
dns_label = st.from_regex(r"[a-z]([a-z0-9-]{0,15}[a-z0-9])?", fullmatch=True)
toleration = st.fixed_dictionaries(
    {
        "key": st.sampled_from(["nvidia.com/gpu", "dedicated", "example.com/pool"]),
        "operator": st.just("Equal"),
        "value": label_value,
    },
    optional={
        "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]),
        "tolerationSeconds": st.integers(0, 3600),
    },
)
placement = st.fixed_dictionaries(
    {},
    optional={
        "nodeSelector": st.dictionaries(st.sampled_from(["pool", "example.com/gpu", "zone"]), label_value, max_size=2),
        "tolerations": st.lists(toleration, max_size=2),
    },
)


@st.composite
def valid_jobs(draw) -> RLJob:
    """RLJobs varying everything the builders read; the rest keeps its defaults."""
    tier_resources = st.fixed_dictionaries(
        {},
        optional={
            "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), quantity, max_size=2),
            "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu"]), quantity, max_size=3),
        },
    )
    min_replicas = draw(st.integers(0, 50))
    spec: dict[str, Any] = {
        "model": {"uri": draw(st.sampled_from(["s3://models/x", "runs/models/tiny"]))},
        "learner": {
            "replicas": draw(st.integers(1, 64)),
            "image": "registry.example.com/learner:1",
            "resources": draw(tier_resources),
        },
        "rollout": {
            "replicas": draw(st.integers(1, 32)),
            "resources": draw(tier_resources),
            "concurrentSessions": draw(st.integers(1, 500)),
        },
        "sandbox": {
            "minReplicas": min_replicas,
            "maxReplicas": min_replicas + draw(st.integers(1, 10)),
            "egress": draw(st.sampled_from(["deny", "allow"])),
            "resources": draw(tier_resources),
            "session": {"timeout": draw(st.sampled_from(["30m", "1h30m", "90s"]))},
        },
        "checkpoint": draw(
            st.fixed_dictionaries(
                {"uri": st.just("s3://ckpt/job")},
                optional={"credentialsSecret": dns_label, "endpointUrl": st.just("http://minio.storage:9000")},
            )
        ),
        "scheduling": {
            "spot": {t: draw(capacity) for t in ("learner", "rollout", "sandbox")},
            **{t: draw(placement) for t in ("learner", "rollout", "sandbox")},
        },
        "suspend": draw(st.booleans()),
    }
    if draw(st.booleans()):
        spec["sandbox"]["runtimeClassName"] = draw(st.sampled_from(["gvisor", "kata-qemu"]))
    if draw(st.booleans()):
        spec["scheduling"]["priorityClassName"] = draw(dns_label)
    metadata = {
        "name": draw(st.from_regex(r"[a-z]([a-z0-9-]{0,38}[a-z0-9])?", fullmatch=True)),
        "labels": draw(st.dictionaries(st.sampled_from(["team", "example.com/project"]), label_value, max_size=2)),
    }
    if draw(st.booleans()):
        metadata["namespace"] = draw(dns_label)
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": metadata, "spec": spec}
    return RLJob.from_manifest(manifest)


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(valid_jobs())
def test_generated_specs_render_valid_kubernetes(job):
    objects = render(job)
    assert_valid_kubernetes(objects)
    assert_security_properties(job, objects)


# ---------------------------------------------------------------------------- security properties
def assert_security_properties(job: RLJob, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        assert obj["metadata"]["ownerReferences"] == [owner_reference(job, UID)], obj["kind"]
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "kuberl"
        assert labels["app.kubernetes.io/instance"] == labels["kuberl.io/job"] == job.name
        assert labels["app.kubernetes.io/managed-by"] == "kuberl-operator"
        assert labels["app.kubernetes.io/component"] == labels["kuberl.io/tier"]
    for role in by_kind(objects, "Role"):
        for rule in role["rules"]:
            assert "*" not in str(rule), rule
            assert rule["resourceNames"] == [job.name] or rule["resourceNames"] == [f"{job.name}-config"]
            assert set(rule["verbs"]) <= {"get", "patch"}
            if "patch" in rule["verbs"]:
                assert rule["resources"] == ["rljobs/status"]
    for tier in ("learner", "rollout"):
        spec = pod_spec(one(objects, "StatefulSet", tier))
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in spec["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
        assert spec["automountServiceAccountToken"] is (tier == "learner")
    sandbox = pod_spec(one(objects, "Deployment", "sandbox"))
    assert sandbox["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in sandbox
    [container] = sandbox["containers"]
    assert_sandbox_security(sandbox, container, job.spec.sandbox.runtime_class_name, SandboxPodSecurity.from_env())
    assert not any(e["name"].startswith("AWS_") for e in container["env"]), "storage credentials in the sandbox"
    assert sandbox.get("runtimeClassName") == job.spec.sandbox.runtime_class_name
    policy = one(objects, "NetworkPolicy", "sandbox")["spec"]
    sandbox_pods = one(objects, "Deployment", "sandbox")["spec"]["selector"]["matchLabels"]
    assert policy["podSelector"]["matchLabels"] == sandbox_pods
    assert policy["policyTypes"] == ["Ingress", "Egress"]
    rollout_pods = one(objects, "StatefulSet", "rollout")["spec"]["selector"]["matchLabels"]
    # the job's rollout pods, then Prometheus (tests/operator/test_network_policy.py covers the rest)
    assert policy["ingress"][0] == {
        "from": [{"podSelector": {"matchLabels": rollout_pods}}],
        "ports": [{"protocol": "TCP", "port": 8700}],
    }
    if job.spec.sandbox.egress == "deny":
        assert policy["egress"] == []
    else:
        blocks = [peer["ipBlock"] for rule in policy["egress"] for peer in rule["to"] if "ipBlock" in peer]
        # the internet, but not cloud metadata (link-local) nor the cluster's own networks; DNS to kube-dns only
        for private in ("169.254.0.0/16", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"):
            assert all(private in b["except"] for b in blocks if ":" not in b["cidr"])
        assert all("fc00::/7" in b["except"] for b in blocks if ":" in b["cidr"])
        [dns] = [rule for rule in policy["egress"] if "ipBlock" not in rule["to"][0]]
        assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}
        assert {p["port"] for p in dns["ports"]} == {53}


def assert_sandbox_security(
    pod: dict[str, Any], container: dict[str, Any], runtime_class: str | None, security: SandboxPodSecurity
) -> None:
    """The supervisor's context: root, but in its own user namespace where the cluster has them; only the
    capabilities it needs, each on Pod Security baseline's list; no privilege escalation; a read-only root
    filesystem; and the whole pod within PSS baseline."""
    context = container["securityContext"]
    user_namespace = security.user_namespace and runtime_class is None
    assert pod.get("hostUsers", True) is not user_namespace
    assert context["capabilities"] == {"drop": ["ALL"], "add": sorted(SANDBOX_CAPABILITIES)}
    assert context["readOnlyRootFilesystem"] is True and context["privileged"] is False
    assert context["allowPrivilegeEscalation"] is False
    assert context["runAsUser"] == 0 and context["runAsNonRoot"] is False
    assert context.get("procMount") == ("Unmasked" if user_namespace else None)
    if security.apparmor_profile != "unconfined":
        assert pss_baseline_violations(pod) == []


def test_security_properties_of_every_example(example):
    assert_security_properties(example, render(example))


# The capabilities of the sandbox supervisor, and nothing else: setpriv (SETUID, SETGID), session folders
# (CHOWN, DAC_OVERRIDE, FOWNER), overrunning commands and namespace holders (KILL). No SYS_ADMIN: sessions'
# namespaces are unprivileged user namespaces.
SUPERVISOR_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]


def test_the_sandbox_pod_has_a_user_namespace_the_supervisors_capabilities_and_meets_pss_baseline():
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-toy")))
    pod = pod_spec(one(render(job), "Deployment", "sandbox"))
    assert pod["hostUsers"] is False
    assert pod["securityContext"] == {}  # seccomp: none stated (the runtimes' default denies unshare)
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "runAsUser": 0,
        "runAsNonRoot": False,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"], "add": SUPERVISOR_CAPABILITIES},
        "procMount": "Unmasked",  # a command's PID namespace mounts a /proc of its own
    }
    assert all(SANDBOX_CAPABILITIES[c] for c in SUPERVISOR_CAPABILITIES), "each capability says why"
    assert pss_baseline_violations(pod) == []
    assert {e["name"]: e.get("value") for e in container["env"]}["KUBERL_SANDBOX_EGRESS"] == "deny"


def test_the_pss_baseline_check_finds_what_baseline_forbids():
    # the check the pods are held to fails where Pod Security admission would refuse the pod
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-toy")))
    pod = pod_spec(one(render(job), "Deployment", "sandbox"))
    context = pod["containers"][0]["securityContext"]
    for change, control in [
        ({"capabilities": {"add": ["SYS_ADMIN"]}}, "capabilities"),
        ({"privileged": True}, "privileged"),
        ({"appArmorProfile": {"type": "Unconfined"}}, "appArmorProfile"),
        ({"seccompProfile": {"type": "Unconfined"}}, "seccompProfile"),
    ]:
        assert any(control in v for v in pss_baseline_violations(with_container_context(pod, {**context, **change})))
    host_users = {**pod, "hostUsers": True}
    assert any("procMount" in v for v in pss_baseline_violations(host_users))


@pytest.mark.parametrize(
    ("env", "host_users", "apparmor", "seccomp"),
    [
        ({}, False, None, None),
        ({USER_NAMESPACE_ENV: "0"}, None, None, None),
        ({USER_NAMESPACE_ENV: "false", APPARMOR_ENV: "runtime/default"}, None, {"type": "RuntimeDefault"}, None),
        ({APPARMOR_ENV: "localhost/sbx"}, False, {"type": "Localhost", "localhostProfile": "sbx"}, None),
        ({SECCOMP_ENV: "localhost/kuberl-sandbox.json"}, False, None, "kuberl-sandbox.json"),
    ],
    ids=["default", "no-user-namespaces", "runtime-default-apparmor", "localhost-apparmor", "localhost-seccomp"],
)
def test_the_operator_environment_says_what_the_cluster_supports(monkeypatch, env, host_users, apparmor, seccomp):
    for name in (USER_NAMESPACE_ENV, APPARMOR_ENV, SECCOMP_ENV):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    objects = render(load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-toy"))))
    assert_valid_kubernetes(objects)
    pod = pod_spec(one(objects, "Deployment", "sandbox"))
    assert pod.get("hostUsers") is host_users
    context = pod["containers"][0]["securityContext"]
    assert context.get("appArmorProfile") == apparmor
    expected = None if seccomp is None else {"type": "Localhost", "localhostProfile": seccomp}
    assert context.get("seccompProfile") == pod["securityContext"].get("seccompProfile") == expected
    assert pss_baseline_violations(pod) == []


def test_a_sandbox_runtime_class_replaces_the_user_namespace():
    # gVisor and Kata bring a kernel of their own, and the kubelet refuses hostUsers: false for them
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-gpu")))
    pod = pod_spec(one(render(job), "Deployment", "sandbox"))
    assert pod["runtimeClassName"] == "gvisor" and "hostUsers" not in pod


def test_an_apparmor_profile_in_another_notation_is_refused():
    with pytest.raises(ValueError, match=APPARMOR_ENV):
        profile(APPARMOR_ENV, "docker-default")


def test_the_sandbox_tier_cannot_reach_storage_or_the_api(example):
    objects = render(example)
    sandbox = pod_spec(one(objects, "Deployment", "sandbox"))
    assert sandbox["enableServiceLinks"] is False
    assert not any("secret" in v for v in map(str, sandbox["volumes"])), "no Secret volumes in sandbox pods"


def test_no_object_carries_an_owner_reference_without_a_uid(example):
    objects = desired_objects(example, "ns", owner=None)
    assert all("ownerReferences" not in o["metadata"] for o in objects)
    with pytest.raises(ValueError, match=r"metadata\.uid"):
        owner_reference(example, "")


# ------------------------------------------------------------------------------- what pods run
def test_the_learner_is_one_pod_per_rank_with_c10d_rendezvous_on_pod_zero(example):
    objects = render(example, "team")
    statefulset = one(objects, "StatefulSet", "learner")
    ranks = example.spec.learner.replicas
    assert statefulset["spec"]["replicas"] == (0 if example.spec.suspend else ranks)
    assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
    service = one(objects, "Service", "learner")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert statefulset["spec"]["serviceName"] == service["metadata"]["name"]
    name = f"{example.name}-learner"
    [container] = pod_spec(statefulset)["containers"]
    argv = container["command"]
    assert argv[0] == "torchrun" and f"--nnodes={ranks}" in argv and "--rdzv-backend=c10d" in argv
    assert f"--rdzv-endpoint={name}-0.{name}.team.svc:29400" in argv
    assert f"--local-addr=$(POD_NAME).{name}.team.svc" in argv
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]
    # the same entrypoint as `kuberl run` (app/kuberl_app/one_machine/processes.py), on the mounted job file
    assert argv[argv.index("-m") + 1 :][:3] == ["kuberl_app.cli", "learner", "/etc/kuberl/job.yaml"]
    rollout_urls = [argv[i + 1] for i, a in enumerate(argv) if a == "--rollout-url"]
    assert rollout_urls == [
        f"http://{example.name}-rollout-{i}.{example.name}-rollout.team.svc:8800"
        for i in range(example.spec.rollout.replicas)
    ]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == ["python", "-m", "kuberl_trainer.final_checkpoint"]
    assert pod_spec(statefulset)["terminationGracePeriodSeconds"] >= 300
    assert one(objects, "PodDisruptionBudget", "learner")["spec"]["minAvailable"] == ranks
    assert one(objects, "PodDisruptionBudget", "rollout")["spec"]["maxUnavailable"] == 1


def test_gpu_resources_and_images_come_from_the_spec(example):
    objects = render(example)
    for kind, tier in (("StatefulSet", "learner"), ("StatefulSet", "rollout"), ("Deployment", "sandbox")):
        section = getattr(example.spec, tier)
        [container] = pod_spec(one(objects, kind, tier))["containers"]
        # an image the job does not name is the operator's default (tests/operator/test_job_images.py)
        assert container["image"] == section.image or container["image"] == JobImages().image(example, tier)
        assert container.get("resources", {}).get("limits", {}) == section.resources.limits
        assert container.get("resources", {}).get("requests", {}) == section.resources.requests


def test_rollout_and_sandbox_probes_and_token(example):
    objects = render(example)
    for kind, tier in (("StatefulSet", "rollout"), ("Deployment", "sandbox")):
        [container] = pod_spec(one(objects, kind, tier))["containers"]
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        token = next(e for e in container["env"] if e["name"] == "KUBERL_SANDBOX_TOKEN")
        secret = {"name": f"{example.name}-sandbox-token", "key": "token"}
        assert token == {"name": "KUBERL_SANDBOX_TOKEN", "valueFrom": {"secretKeyRef": secret}}
    deployment = one(objects, "Deployment", "sandbox")
    assert deployment["spec"]["replicas"] == example.spec.sandbox.min_replicas
    assert pod_spec(deployment)["containers"][0]["command"][:4] == ["python", "-m", "kuberl_app.cli", "sandbox"]


@pytest.mark.parametrize(
    ("resources", "threads"),
    [
        ({"limits": {"cpu": "4"}, "requests": {"cpu": 2}}, "4"),
        ({"requests": {"cpu": "1500m"}}, "1"),
        ({"requests": {"cpu": "250m"}}, "1"),
        ({"requests": {"cpu": 16}, "limits": {"nvidia.com/gpu": 1}}, None),  # vLLM on a GPU: its own choice
        ({"requests": {"memory": "8Gi"}}, None),
    ],
)
def test_a_cpu_rollout_engine_gets_the_pods_cores_as_unpinned_threads(resources, threads):
    manifest = yaml.safe_load(next(p for p in EXAMPLES if p.stem == "swe-toy").read_text())
    manifest["spec"]["rollout"]["resources"] = resources
    job = RLJob.from_manifest(manifest)
    env = {
        e["name"]: e.get("value") for e in pod_spec(one(render(job), "StatefulSet", "rollout"))["containers"][0]["env"]
    }
    assert env.get("OMP_NUM_THREADS") == threads
    assert env.get("VLLM_CPU_OMP_THREADS_BIND") == ("nobind" if threads else None)


def test_s3_credentials_come_from_the_named_secret():
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-gpu")))
    objects = render(job)
    for tier in ("learner", "rollout"):
        env = pod_spec(one(objects, "StatefulSet", tier))["containers"][0]["env"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in env if "secretKeyRef" in e.get("valueFrom", {})}
        assert refs["AWS_ACCESS_KEY_ID"] == {"name": "s3-credentials", "key": "AWS_ACCESS_KEY_ID"}
        assert refs["AWS_SECRET_ACCESS_KEY"] == {"name": "s3-credentials", "key": "AWS_SECRET_ACCESS_KEY"}


def test_the_config_map_holds_the_resolved_job_the_pods_read(example):
    config = one(render(example, "elsewhere"), "ConfigMap", "config")
    reread = RLJob.from_manifest(yaml.safe_load(config["data"]["job.yaml"]))
    assert reread.spec == JobImages().resolved(example).spec  # the images the pods run written out
    assert reread.metadata.namespace == "elsewhere"
    assert resolved_job_manifest(example, "x")["spec"]["learner"]["replicas"] == example.spec.learner.replicas


def test_suspended_jobs_scale_every_tier_to_zero(example):
    objects = render(example.model_copy(update={"spec": example.spec.model_copy(update={"suspend": True})}))
    assert [o["spec"]["replicas"] for o in objects if o["kind"] in WORKLOADS] == [0, 0, 0]


def test_an_hpa_scales_the_sandbox_tier_only_when_the_spec_asks_for_one(example):
    assert not by_kind(render(example), "HorizontalPodAutoscaler")
    sandbox = example.spec.sandbox.model_copy(update={"autoscaler": SandboxAutoscaler.HPA, "sessions_per_pod": 10})
    objects = render(example.model_copy(update={"spec": example.spec.model_copy(update={"sandbox": sandbox})}))
    assert_valid_kubernetes(objects)
    hpa = one(objects, "HorizontalPodAutoscaler", "sandbox")
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment", "sandbox")["metadata"]["name"]
    assert hpa["spec"]["maxReplicas"] == sandbox.max_replicas
    [metric] = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["selector"] == {"matchLabels": {"rljob": example.name}}
    assert metric["external"]["target"]["averageValue"] == "8000m"  # 10 sessions a pod, 25 % headroom
    assert hpa["spec"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_a_queued_job_is_one_kueue_workload_with_a_pod_set_per_tier():
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-gpu")))
    objects = render(job)
    workload = objects[0]  # first: Kueue knows the job before any pod of it may start
    assert workload["kind"] == "Workload" and workload["spec"]["queueName"] == job.spec.scheduling.queue_name
    assert workload["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == job.spec.scheduling.queue_name
    counts = {p["name"]: p["count"] for p in workload["spec"]["podSets"]}
    assert counts == {
        "learner": job.spec.learner.replicas,
        "rollout": job.spec.rollout.replicas,
        "sandbox": job.spec.sandbox.min_replicas,
    }
    for pod_set in workload["spec"]["podSets"]:  # Kueue charges quota for exactly the pods the tiers run
        assert pod_set["template"] == one(objects, *WORKLOAD_OF[pod_set["name"]])["spec"]["template"]
    assert not any(
        o["kind"] == "Workload"
        for o in render(
            job.model_copy(
                update={
                    "spec": job.spec.model_copy(
                        update={"scheduling": job.spec.scheduling.model_copy(update={"queue_name": None})}
                    )
                }
            )
        )
    )


# ------------------------------------------------------------------------------------- placement
def test_spot_policy_becomes_node_affinity_and_tolerations():
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-gpu")))  # learner on-demand, rollout
    objects = render(job)  # prefer-spot, sandbox spot
    learner = pod_spec(one(objects, "StatefulSet", "learner"))
    [term] = learner["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert {e["key"] for e in term["matchExpressions"]} == {k for k, _ in SPOT_NODE_LABELS}
    assert all(e["operator"] == "NotIn" for e in term["matchExpressions"])
    assert learner["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}
    assert learner["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert learner["priorityClassName"] == "rl-training"
    rollout = pod_spec(one(objects, "StatefulSet", "rollout"))
    preferred = rollout["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert {p["preference"]["matchExpressions"][0]["key"] for p in preferred} == {k for k, _ in SPOT_NODE_LABELS}
    assert {
        "key": "kubernetes.azure.com/scalesetpriority",
        "operator": "Equal",
        "value": "spot",
        "effect": "NoSchedule",
    } in rollout["tolerations"]
    sandbox = pod_spec(one(objects, "Deployment", "sandbox"))
    terms = sandbox["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [t["matchExpressions"][0]["operator"] for t in terms] == ["In"] * len(SPOT_NODE_LABELS)
    assert sandbox["runtimeClassName"] == "gvisor"


def test_the_sandbox_token_secret_is_built_from_a_given_token(example):
    secret = build_sandbox_token_secret(example, "ns", owner_reference(example, UID), "s3cr3t")
    kubernetes_validate.validate(secret, NEWEST, strict=True)
    assert secret["metadata"]["name"] == f"{example.name}-sandbox-token" and secret["stringData"] == {"token": "s3cr3t"}
    assert all(o["kind"] != "Secret" for o in render(example)), "a re-applied desired state must not rotate tokens"


def test_the_pre_stop_hook_finds_the_learner_processes_of_a_parent():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 5
        while child.pid not in children_of(os.getpid()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert child.pid in children_of(os.getpid())
    finally:
        child.kill()
        child.wait()


def test_torchrun_argv_names_the_job_for_the_rendezvous(example):
    assert f"--rdzv-id={example.name}" in torchrun_argv(example, "ns")
