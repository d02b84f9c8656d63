"""The NetworkPolicies of a job's tiers: each tier admits only the job's own pods that call it, the operator
where it scrapes, and Prometheus on the metrics ports.

| Tier    | Admits (ingress)                                                                  | Egress           |
|---------|-----------------------------------------------------------------------------------|------------------|
| learner | the job's learner pods, every port (c10d store, torchrun's worker store, NCCL);   | unrestricted     |
|         | the monitoring namespace on 9400 (`metrics`)                                      |                  |
| rollout | the job's learner pods on 8800 (work, weights); the operator on 8800 (sandbox     | unrestricted     |
|         | demand, `/metrics`); the monitoring namespace on 8800 (`http`, which serves it)   |                  |
| sandbox | the job's rollout pods on 8700; the monitoring namespace on 8700                  | none, or the     |
|         |                                                                                   | internet (spec)  |

Peers are matched by tier, not by job alone: sandbox pods run agent code, and a job's own sandbox may no more
reach its learner or rollout servers than another job's may. Learner and rollout egress is left open: they
reach the API server, S3 (or any checkpoint store) and DNS at addresses the operator cannot know, and they run
only the job author's code, never the agent's.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kuberl.api import env_vars
from kuberl.api.rljob import RLJob
from kuberl.api.spec import EgressPolicy
from kuberl_operator.learner_gang import METRICS_PORT as LEARNER_METRICS_PORT
from kuberl_operator.meta import LEARNER, ROLLOUT, SANDBOX, child_name, object_meta, selector_labels
from kuberl_operator.rollout import ROLLOUT_PORT, SANDBOX_PORT

# Even with egress allowed, link-local addresses stay closed: cloud metadata endpoints (169.254.169.254,
# fd00:ec2::254) hand out the node's cloud credentials to whoever asks; so do private networks: the cluster's pods
# and services, the nodes and their neighbours. The public internet is open, and the cluster's DNS (below).
ALLOWED_EGRESS = (
    {
        "cidr": "0.0.0.0/0",
        "except": ["10.0.0.0/8", "100.64.0.0/10", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"],
    },
    {"cidr": "::/0", "except": ["fc00::/7", "fe80::/10"]},
)
CLUSTER_DNS = {"k8s-app": "kube-dns"}
"""The cluster's DNS pods (CoreDNS and kube-dns both carry this label), in kube-system."""

# The operator pod's labels that the chart sets and no value can change (charts/kuberl/templates/_helpers.tpl;
# the release name and nameOverride vary, these do not). Matched only inside the operator's namespace.
OPERATOR_POD_LABELS = {"app.kubernetes.io/part-of": "kuberl", "app.kubernetes.io/component": "operator"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace


@dataclass(frozen=True)
class NetworkPeers:
    """Who outside a job its NetworkPolicies admit, the same for every RLJob an operator serves."""

    operator_namespace: str = "kuberl-system"
    """Where the operator runs (the chart sets its release namespace): its pods there may scrape the rollout
    pods. Empty: none may (sandbox autoscaling then holds where policies are enforced)."""
    monitoring_namespace: str = "monitoring"
    """Every pod of this namespace may scrape each tier's metrics port. Empty: none may."""

    @staticmethod
    def from_env(env: Mapping[str, str] = os.environ) -> NetworkPeers:
        """From the chart's variables; an unset one keeps its default, an empty one means none."""
        default = NetworkPeers()
        return NetworkPeers(
            operator_namespace=env.get(env_vars.OPERATOR_NAMESPACE, default.operator_namespace).strip(),
            monitoring_namespace=env.get(env_vars.OPERATOR_MONITORING_NAMESPACE, default.monitoring_namespace).strip(),
        )


def egress_rules(job: RLJob) -> list[dict[str, Any]]:
    """No rules (deny all, DNS included: the server only answers) unless spec.sandbox.egress is allow: then the
    public internet and the cluster's DNS (sessions resolve names through their user-mode stack, which asks the
    pod's resolver)."""
    if job.spec.sandbox.egress != EgressPolicy.ALLOW:
        return []
    dns = {
        "to": [namespace_peer("kube-system", CLUSTER_DNS)],
        "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
    }
    return [{"to": [{"ipBlock": {"cidr": b["cidr"], "except": list(b["except"])}} for b in ALLOWED_EGRESS]}, dns]


def tier_peer(job: RLJob, tier: str) -> dict[str, Any]:
    """The job's pods of one tier, in the policy's own namespace."""
    return {"podSelector": {"matchLabels": selector_labels(job, tier)}}


def namespace_peer(namespace: str, pod_labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Pods of another namespace: all of them, or those with `pod_labels` (one peer: both must match)."""
    peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}}}
    if pod_labels:
        peer["podSelector"] = {"matchLabels": dict(pod_labels)}
    return peer


def ingress_rule(peers: list[dict[str, Any]], port: int | None = None) -> dict[str, Any]:
    """Traffic from `peers`, to one TCP port or (None) to every port."""
    rule: dict[str, Any] = {"from": peers}
    if port is not None:
        rule["ports"] = [{"protocol": "TCP", "port": port}]
    return rule


def monitoring_rules(peers: NetworkPeers, metrics_port: int) -> list[dict[str, Any]]:
    """Prometheus' scrapes of a tier's metrics port, or nothing when no monitoring namespace is set."""
    if not peers.monitoring_namespace:
        return []
    return [ingress_rule([namespace_peer(peers.monitoring_namespace)], metrics_port)]


def network_policy(
    job: RLJob,
    tier: str,
    namespace: str,
    owner: dict[str, Any] | None,
    ingress: list[dict[str, Any]],
    egress: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """`<job>-<tier>` over the tier's pods. Ingress is always listed, so what no rule admits is denied;
    egress is restricted only when `egress` is given (an empty list denies all)."""
    spec: dict[str, Any] = {
        "podSelector": {"matchLabels": selector_labels(job, tier)},
        "policyTypes": ["Ingress"] if egress is None else ["Ingress", "Egress"],
        "ingress": ingress,
    }
    if egress is not None:
        spec["egress"] = egress
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(job, child_name(job, tier), tier, namespace, owner),
        "spec": spec,
    }


def build_learner_network_policy(
    job: RLJob, namespace: str, owner: dict[str, Any] | None, peers: NetworkPeers | None = None
) -> dict[str, Any]:
    """The job's ranks reach each other on every port: the c10d rendezvous (29400) is only the start, the
    workers' store and NCCL pick free ports. Nothing else calls the learner; Prometheus scrapes rank 0."""
    peers = peers or NetworkPeers()
    ingress = [ingress_rule([tier_peer(job, LEARNER)]), *monitoring_rules(peers, LEARNER_METRICS_PORT)]
    return network_policy(job, LEARNER, namespace, owner, ingress)


def build_rollout_network_policy(
    job: RLJob, namespace: str, owner: dict[str, Any] | None, peers: NetworkPeers | None = None
) -> dict[str, Any]:
    """The learner sends work and weights; the operator scrapes the sandbox demand from `/metrics`
    (kuberl_operator.demand), as Prometheus does. All on the one API port, 8800."""
    peers = peers or NetworkPeers()
    ingress = [ingress_rule([tier_peer(job, LEARNER)], ROLLOUT_PORT)]
    if peers.operator_namespace:
        ingress.append(ingress_rule([namespace_peer(peers.operator_namespace, OPERATOR_POD_LABELS)], ROLLOUT_PORT))
    ingress += monitoring_rules(peers, ROLLOUT_PORT)
    return network_policy(job, ROLLOUT, namespace, owner, ingress)


def build_sandbox_network_policy(
    job: RLJob, namespace: str, owner: dict[str, Any] | None, peers: NetworkPeers | None = None
) -> dict[str, Any]:
    """Default deny both ways. Ingress: this job's rollout pods, and Prometheus, on the sandbox port (its
    API needs the job's token); egress per spec.sandbox.egress."""
    peers = peers or NetworkPeers()
    ingress = [ingress_rule([tier_peer(job, ROLLOUT)], SANDBOX_PORT), *monitoring_rules(peers, SANDBOX_PORT)]
    return network_policy(job, SANDBOX, namespace, owner, ingress, egress=egress_rules(job))
