"""The sandbox NetworkPolicy: default deny, ingress only from the job's rollout pods."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.spec import EgressPolicy
from kuberl_operator.meta import ROLLOUT, SANDBOX, child_name, object_meta, selector_labels
from kuberl_operator.rollout import SANDBOX_PORT

# Even with egress allowed, link-local addresses stay closed: cloud metadata endpoints
# (169.254.169.254, fd00:ec2::254) hand out the node's cloud credentials to whoever asks.
ALLOWED_EGRESS = (
    {"cidr": "0.0.0.0/0", "except": ["169.254.0.0/16"]},
    {"cidr": "::/0", "except": ["fe80::/10", "fd00:ec2::254/128"]},
)


def egress_rules(job: RLJob) -> list[dict[str, Any]]:
    """No rules (deny all, DNS included: the server only answers) unless spec.sandbox.egress is allow."""
    if job.spec.sandbox.egress != EgressPolicy.ALLOW:
        return []
    return [{"to": [{"ipBlock": {"cidr": b["cidr"], "except": list(b["except"])}} for b in ALLOWED_EGRESS]}]


def build_sandbox_network_policy(job: RLJob, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """Both policy types are listed, so whatever no rule admits is denied. Ingress: only this job's rollout
    pods, only the sandbox port (Prometheus scrapes of /metrics need a policy of the cluster's own)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": object_meta(job, child_name(job, SANDBOX), SANDBOX, namespace, owner),
        "spec": {
            "podSelector": {"matchLabels": selector_labels(job, SANDBOX)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": selector_labels(job, ROLLOUT)}}],
                    "ports": [{"protocol": "TCP", "port": SANDBOX_PORT}],
                }
            ],
            "egress": egress_rules(job),
        },
    }
