"""Every tier's NetworkPolicy: valid Kubernetes, over the tier's own pods, and admitting exactly the callers
the design names: the job's own pods of the calling tier, the operator where it scrapes, Prometheus on the
metrics ports. Reachability is read off the rendered policies by `admits`, which applies the NetworkPolicy
rules to a source pod, a target pod and a port, as a CNI that enforces them would."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kubernetes_validate
import pytest
from conftest import EXAMPLES, REPO

from kuberl.api.rljob import RLJob
from kuberl.validation import load_rljob
from kuberl_operator.desired import desired_objects
from kuberl_operator.meta import LEARNER, ROLLOUT, SANDBOX, TIER_LABEL
from kuberl_operator.network_policy import OPERATOR_POD_LABELS, NetworkPeers

OLDEST, NEWEST = "1.30", kubernetes_validate.utils.latest_version()
TEAM, OTHER_TEAM = "team", "other-team"
PEERS = NetworkPeers(operator_namespace="kuberl-system", monitoring_namespace="monitoring")
NAMESPACE_NAME = "kubernetes.io/metadata.name"
NCCL_PORT = 43517  # any port: NCCL and torchrun's worker store pick free ones


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str] = field(default_factory=dict)


def selects(selector: dict[str, Any], labels: Mapping[str, str]) -> bool:
    """A LabelSelector as the builders write them: matchLabels only ({} selects everything)."""
    assert set(selector) <= {"matchLabels"}, f"the helper knows matchLabels only: {selector}"
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def peer_matches(peer: dict[str, Any], policy_namespace: str, source: Pod) -> bool:
    assert set(peer) <= {"podSelector", "namespaceSelector"}, f"the helper knows no ipBlock in ingress: {peer}"
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], {NAMESPACE_NAME: source.namespace})
    else:
        in_namespace = source.namespace == policy_namespace
    return in_namespace and selects(peer.get("podSelector", {}), source.labels)


def rule_admits(rule: dict[str, Any], policy_namespace: str, source: Pod, port: int) -> bool:
    peers, ports = rule.get("from"), rule.get("ports")
    from_ok = not peers or any(peer_matches(p, policy_namespace, source) for p in peers)
    port_ok = not ports or any(p["port"] == port and p.get("protocol", "TCP") == "TCP" for p in ports)
    return from_ok and port_ok


def admits(policies: list[dict[str, Any]], source: Pod, target: Pod, port: int) -> bool:
    """Whether TCP from `source` to `target`:`port` gets in: a pod no Ingress policy selects admits all;
    one that some select admits what any of their rules admits (policies add up)."""
    isolating = [
        p
        for p in policies
        if p["metadata"]["namespace"] == target.namespace
        and "Ingress" in p["spec"]["policyTypes"]
        and selects(p["spec"]["podSelector"], target.labels)
    ]
    return not isolating or any(
        rule_admits(rule, p["metadata"]["namespace"], source, port) for p in isolating for rule in p["spec"]["ingress"]
    )


def render(job: RLJob, namespace: str = TEAM, peers: NetworkPeers = PEERS) -> list[dict[str, Any]]:
    return desired_objects(job, namespace, owner=None, peers=peers)


def policies_of(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["labels"][TIER_LABEL]: o for o in objects if o["kind"] == "NetworkPolicy"}


def pods_of(objects: list[dict[str, Any]]) -> dict[str, Pod]:
    """tier -> a pod as its workload's template makes it."""
    return {
        o["metadata"]["labels"][TIER_LABEL]: Pod(
            o["metadata"]["namespace"], o["spec"]["template"]["metadata"]["labels"]
        )
        for o in objects
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def container_port(objects: list[dict[str, Any]], tier: str, name: str) -> int:
    [workload] = [o for o in objects if o["kind"] in ("StatefulSet", "Deployment") and tier in o["metadata"]["name"]]
    [container] = workload["spec"]["template"]["spec"]["containers"]
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


@pytest.fixture(params=EXAMPLES, ids=[p.stem for p in EXAMPLES])
def example(request) -> RLJob:
    return load_rljob(str(request.param))


SWE_TOY = load_rljob(str(REPO / "examples" / "swe-toy.yaml"))
JOB_A = SWE_TOY.model_copy(update={"metadata": SWE_TOY.metadata.model_copy(update={"name": "job-a"})})
JOB_B = SWE_TOY.model_copy(update={"metadata": SWE_TOY.metadata.model_copy(update={"name": "job-b"})})
OBJECTS_A, OBJECTS_B = render(JOB_A), render(JOB_B)
# two jobs side by side in one namespace: every policy of both is in force
POLICIES = [*policies_of(OBJECTS_A).values(), *policies_of(OBJECTS_B).values()]
A, B = pods_of(OBJECTS_A), pods_of(OBJECTS_B)
OPERATOR = Pod("kuberl-system", {"app.kubernetes.io/name": "kuberl", **OPERATOR_POD_LABELS})
PROMETHEUS = Pod("monitoring", {"app.kubernetes.io/name": "prometheus"})
SOURCES = {
    "a-learner": A[LEARNER],
    "a-rollout": A[ROLLOUT],
    "a-sandbox": A[SANDBOX],
    "b-learner": B[LEARNER],
    "b-rollout": B[ROLLOUT],
    "operator": OPERATOR,
    "prometheus": PROMETHEUS,
    # a tenant's pod elsewhere, labelled as job A's learner and as the operator: labels are not identity
    "a-learner-label-elsewhere": Pod(OTHER_TEAM, A[LEARNER].labels),
    "operator-label-elsewhere": Pod(OTHER_TEAM, OPERATOR.labels),
    "other-pod-of-operator-namespace": Pod("kuberl-system", {"app": "something-else"}),
    "prometheus-label-elsewhere": Pod(OTHER_TEAM, PROMETHEUS.labels),
}


# ------------------------------------------------------------------------------ shape
def test_every_tier_has_a_policy_over_its_own_pods_valid_for_kubernetes(example):
    objects = render(example)
    policies = policies_of(objects)
    assert set(policies) == {LEARNER, ROLLOUT, SANDBOX}
    for tier, policy in policies.items():
        assert policy["metadata"]["name"] == f"{example.name}-{tier}"
        [workload] = [
            o
            for o in objects
            if o["kind"] in ("StatefulSet", "Deployment") and o["metadata"]["labels"][TIER_LABEL] == tier
        ]
        assert policy["spec"]["podSelector"] == workload["spec"]["selector"]
        for version in (OLDEST, NEWEST):
            kubernetes_validate.validate(policy, version, strict=True)


def test_learner_and_rollout_egress_stays_open_sandbox_egress_is_denied():
    policies = policies_of(OBJECTS_A)
    assert policies[LEARNER]["spec"]["policyTypes"] == policies[ROLLOUT]["spec"]["policyTypes"] == ["Ingress"]
    assert policies[SANDBOX]["spec"]["policyTypes"] == ["Ingress", "Egress"]


def test_every_policy_is_applied_before_any_pod_of_its_tier():
    kinds = [o["kind"] for o in OBJECTS_A]
    last_policy = max(i for i, kind in enumerate(kinds) if kind == "NetworkPolicy")
    assert last_policy < min(i for i, kind in enumerate(kinds) if kind in ("StatefulSet", "Deployment"))


# ------------------------------------------------------------------------------ who reaches what
RENDEZVOUS, LEARNER_METRICS, ROLLOUT_HTTP, SANDBOX_HTTP = 29400, 9400, 8800, 8700
REACH = [
    # the learner: its own ranks on any port; Prometheus on the metrics port; nobody else
    ("a-learner", LEARNER, RENDEZVOUS, True),
    ("a-learner", LEARNER, NCCL_PORT, True),
    ("a-rollout", LEARNER, RENDEZVOUS, False),
    ("a-sandbox", LEARNER, RENDEZVOUS, False),
    ("a-sandbox", LEARNER, LEARNER_METRICS, False),
    ("b-learner", LEARNER, RENDEZVOUS, False),
    ("b-learner", LEARNER, NCCL_PORT, False),
    ("operator", LEARNER, LEARNER_METRICS, False),
    ("prometheus", LEARNER, LEARNER_METRICS, True),
    ("prometheus", LEARNER, RENDEZVOUS, False),
    ("a-learner-label-elsewhere", LEARNER, RENDEZVOUS, False),
    ("prometheus-label-elsewhere", LEARNER, LEARNER_METRICS, False),
    # rollout servers: the job's learner and the operator on the API port; Prometheus there too
    ("a-learner", ROLLOUT, ROLLOUT_HTTP, True),
    ("a-learner", ROLLOUT, NCCL_PORT, False),
    ("a-sandbox", ROLLOUT, ROLLOUT_HTTP, False),
    ("b-learner", ROLLOUT, ROLLOUT_HTTP, False),
    ("b-rollout", ROLLOUT, ROLLOUT_HTTP, False),
    ("operator", ROLLOUT, ROLLOUT_HTTP, True),
    ("operator", ROLLOUT, NCCL_PORT, False),
    ("operator-label-elsewhere", ROLLOUT, ROLLOUT_HTTP, False),
    ("other-pod-of-operator-namespace", ROLLOUT, ROLLOUT_HTTP, False),
    ("prometheus", ROLLOUT, ROLLOUT_HTTP, True),
    ("a-learner-label-elsewhere", ROLLOUT, ROLLOUT_HTTP, False),
    # sandbox servers: the job's rollout servers, and Prometheus, on the sandbox port
    ("a-rollout", SANDBOX, SANDBOX_HTTP, True),
    ("a-rollout", SANDBOX, NCCL_PORT, False),
    ("a-learner", SANDBOX, SANDBOX_HTTP, False),
    ("b-rollout", SANDBOX, SANDBOX_HTTP, False),
    ("operator", SANDBOX, SANDBOX_HTTP, False),
    ("prometheus", SANDBOX, SANDBOX_HTTP, True),
]


@pytest.mark.parametrize(
    ("source", "tier", "port", "admitted"),
    REACH,
    ids=[f"{s}-to-{t}:{p}-{'in' if a else 'out'}" for s, t, p, a in REACH],
)
def test_who_reaches_which_tier_of_job_a(source, tier, port, admitted):
    assert admits(POLICIES, SOURCES[source], A[tier], port) is admitted


def test_the_helper_admits_everything_to_a_pod_no_policy_selects():
    # guards the guard: without the job's policies, a tenant's pod would reach job A's learner
    assert admits([], SOURCES["b-learner"], A[LEARNER], RENDEZVOUS)
    assert admits(list(policies_of(OBJECTS_B).values()), SOURCES["b-learner"], A[LEARNER], RENDEZVOUS)


def test_a_job_of_the_same_name_in_another_namespace_is_another_job():
    elsewhere = pods_of(render(JOB_A, namespace=OTHER_TEAM))
    policies = [*POLICIES, *policies_of(render(JOB_A, namespace=OTHER_TEAM)).values()]
    assert not admits(policies, elsewhere[LEARNER], A[LEARNER], RENDEZVOUS)
    assert not admits(policies, elsewhere[LEARNER], A[ROLLOUT], ROLLOUT_HTTP)
    assert admits(policies, elsewhere[LEARNER], elsewhere[ROLLOUT], ROLLOUT_HTTP)


# ------------------------------------------------------------------------------ the configured peers
@pytest.mark.parametrize("tier", [LEARNER, ROLLOUT, SANDBOX])
def test_the_monitoring_namespace_is_admitted_to_the_metrics_port_only(tier):
    # the learner's metrics port is `metrics`; the rollout and sandbox servers serve /metrics on `http`
    metrics_port = container_port(OBJECTS_A, tier, "metrics" if tier == LEARNER else "http")
    rules = policies_of(OBJECTS_A)[tier]["spec"]["ingress"]
    monitoring = [r for r in rules if any("namespaceSelector" in p and "podSelector" not in p for p in r["from"])]
    assert monitoring == [
        {
            "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME: "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": metrics_port}],
        }
    ]


def test_no_monitoring_namespace_admits_no_scrapes():
    objects = render(JOB_A, peers=NetworkPeers(monitoring_namespace=""))
    policies, pods = list(policies_of(objects).values()), pods_of(objects)
    assert not admits(policies, PROMETHEUS, pods[LEARNER], LEARNER_METRICS)
    assert not admits(policies, PROMETHEUS, pods[ROLLOUT], ROLLOUT_HTTP)
    assert not admits(policies, PROMETHEUS, pods[SANDBOX], SANDBOX_HTTP)
    assert admits(policies, OPERATOR, pods[ROLLOUT], ROLLOUT_HTTP)


def test_the_operator_is_admitted_from_the_namespace_it_is_told_and_not_without_one():
    moved = NetworkPeers(operator_namespace="platform")
    objects = render(JOB_A, peers=moved)
    policies, rollout = list(policies_of(objects).values()), pods_of(objects)[ROLLOUT]
    assert admits(policies, Pod("platform", OPERATOR.labels), rollout, ROLLOUT_HTTP)
    assert not admits(policies, OPERATOR, rollout, ROLLOUT_HTTP)
    objects = render(JOB_A, peers=NetworkPeers(operator_namespace=""))
    policies = list(policies_of(objects).values())
    assert not admits(policies, OPERATOR, pods_of(objects)[ROLLOUT], ROLLOUT_HTTP)
    assert admits(policies, A[LEARNER], pods_of(objects)[ROLLOUT], ROLLOUT_HTTP)


def test_peers_come_from_the_operator_environment():
    assert NetworkPeers.from_env({}) == NetworkPeers("kuberl-system", "monitoring")
    env = {"KUBERL_OPERATOR_NAMESPACE": "platform", "KUBERL_OPERATOR_MONITORING_NAMESPACE": " prom "}
    assert NetworkPeers.from_env(env) == NetworkPeers("platform", "prom")
    assert NetworkPeers.from_env({"KUBERL_OPERATOR_MONITORING_NAMESPACE": ""}).monitoring_namespace == ""
