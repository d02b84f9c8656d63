"""Kueue admission: a job with `spec.scheduling.queueName` is represented to Kueue by a Workload (its three
tiers as pod sets) and runs only while Kueue admits it.

Kueue admits a Workload all or nothing, so the learner gang gets every rank's GPUs or none, and the tiers
start together. Until admission, and again after an eviction (Kueue preempting for a higher-priority
workload), the job is Suspended with reason WaitingForAdmission: every tier at zero replicas, the learner
having written its final checkpoint on the way down.

What Kueue needs (see docs/operator.md): its Workload CRD (kueue.x-k8s.io/v1beta1), a LocalQueue of that
name in the job's namespace, and the operator allowed to create and watch Workloads. The pod sets'
resources are what Kueue charges against the ClusterQueue's quota; the sandbox tier is counted at
`minReplicas` (its autoscaled pods above that are not queued).
"""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl_operator.meta import LEARNER, QUEUE, ROLLOUT, SANDBOX, child_name, object_meta

WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta1"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"


def build_workload(
    job: RLJob, namespace: str, owner: dict[str, Any] | None, templates: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The Workload for a queued job; `templates` are the tiers' pod templates (from their workloads)."""
    spec = job.spec
    counts = {LEARNER: spec.learner.replicas, ROLLOUT: spec.rollout.replicas, SANDBOX: spec.sandbox.min_replicas}
    meta = object_meta(job, child_name(job, QUEUE), QUEUE, namespace, owner)
    meta["labels"][QUEUE_NAME_LABEL] = spec.scheduling.queue_name
    workload: dict[str, Any] = {
        "apiVersion": WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": meta,
        "spec": {
            "queueName": spec.scheduling.queue_name,
            "podSets": [
                {"name": tier, "count": counts[tier], "template": templates[tier]}
                for tier in (LEARNER, ROLLOUT, SANDBOX)
                if counts[tier] > 0
            ],
        },
    }
    if spec.scheduling.priority_class_name:
        workload["spec"]["priorityClassName"] = spec.scheduling.priority_class_name
    return workload


def admitted(workload: dict[str, Any] | None) -> bool:
    """Whether Kueue admits the Workload now: Admitted true and not being evicted."""
    conditions = {
        c.get("type"): c.get("status") for c in ((workload or {}).get("status") or {}).get("conditions") or []
    }
    return conditions.get("Admitted") == "True" and conditions.get("Evicted") != "True"
