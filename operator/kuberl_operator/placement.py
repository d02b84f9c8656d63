"""Node placement of a tier from spec.scheduling: node selector, tolerations, priority and spot capacity."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.spec import Capacity, TierPlacement, Toleration

# How the major clouds and Karpenter label spot nodes: (label, value on spot nodes). A node matches
# "spot" when any of them says so; "on-demand" means none of them does (NotIn also matches unlabelled
# nodes, so clusters without any of these labels schedule on-demand pods anywhere).
SPOT_NODE_LABELS = (
    ("cloud.google.com/gke-spot", "true"),
    ("eks.amazonaws.com/capacityType", "SPOT"),
    ("karpenter.sh/capacity-type", "spot"),
    ("kubernetes.azure.com/scalesetpriority", "spot"),
)

# Taints that announce a node is about to go (a spot reclaim, a scale-down, a drain): the operator treats its
# pods as preempted before the node goes, so the learner checkpoints and rollout work moves in good time.
PREEMPTION_NOTICE_TAINTS = frozenset(
    {
        "cloud.google.com/impending-node-termination",  # GKE, on a spot/preemptible reclaim
        "aws-node-termination-handler/spot-itn",  # AWS node termination handler, spot interruption notice
        "aws-node-termination-handler/rebalance-recommendation",
        "karpenter.sh/disrupted",  # Karpenter v1 (karpenter.sh/disruption in v0.3x) before it drains a node
        "karpenter.sh/disruption",
        "ToBeDeletedByClusterAutoscaler",  # the cluster autoscaler, before it removes a node
        "node.kubernetes.io/out-of-service",
    }
)

# Taints clouds put on spot nodes (AKS always; GKE when asked to); a pod allowed on spot tolerates them.
SPOT_TOLERATIONS = (
    {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
    {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"},
)


def toleration(t: Toleration) -> dict[str, Any]:
    """A spec toleration in Kubernetes form (empty fields left out)."""
    out: dict[str, Any] = {"operator": t.operator}
    if t.key is not None:
        out["key"] = t.key
    if t.value is not None and t.operator == "Equal":
        out["value"] = t.value
    if t.effect is not None:
        out["effect"] = t.effect
    if t.toleration_seconds is not None:
        out["tolerationSeconds"] = t.toleration_seconds
    return out


def spot_affinity(capacity: Capacity) -> dict[str, Any]:
    """Node affinity for a capacity type: required off spot, required on spot, or preferred on spot."""
    if capacity == Capacity.ON_DEMAND:
        term = {"matchExpressions": [{"key": k, "operator": "NotIn", "values": [v]} for k, v in SPOT_NODE_LABELS]}
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
    terms = [{"matchExpressions": [{"key": k, "operator": "In", "values": [v]}]} for k, v in SPOT_NODE_LABELS]
    if capacity == Capacity.SPOT:
        # nodeSelectorTerms are ORed: a spot node of any cloud qualifies
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    return {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": t} for t in terms]}


def pod_placement(job: RLJob, tier: str) -> dict[str, Any]:
    """The pod-spec fields that place a tier's pods: nodeSelector, affinity, tolerations, priorityClassName."""
    scheduling = job.spec.scheduling
    placement: TierPlacement = getattr(scheduling, tier)
    capacity: Capacity = getattr(scheduling.spot, tier)
    out: dict[str, Any] = {"affinity": {"nodeAffinity": spot_affinity(capacity)}}
    if placement.node_selector:
        out["nodeSelector"] = dict(placement.node_selector)
    tolerations = [toleration(t) for t in placement.tolerations]
    if capacity != Capacity.ON_DEMAND:
        tolerations += [dict(t) for t in SPOT_TOLERATIONS if t not in tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    if scheduling.priority_class_name:
        out["priorityClassName"] = scheduling.priority_class_name
    return out
