"""Names, labels and owner references shared by every child object of an RLJob."""

from __future__ import annotations

from typing import Any

from kuberl.api.rljob import RLJob
from kuberl.api.spec import API_VERSION, KIND

MANAGED_BY = "kuberl-operator"
JOB_LABEL = "kuberl.io/job"
TIER_LABEL = "kuberl.io/tier"

LEARNER, ROLLOUT, SANDBOX, CONFIG, QUEUE = "learner", "rollout", "sandbox", "config", "queue"

# The annotation `kubectl apply` writes holds the whole manifest: copying it onto children is noise.
_SKIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)


def child_name(job: RLJob, tier: str) -> str:
    """`<job>-<tier>`: short enough for StatefulSet pods and their revision hash (see MAX_JOB_NAME)."""
    return f"{job.name}-{tier}"


def selector_labels(job: RLJob, tier: str) -> dict[str, str]:
    """The labels selectors match on. Selectors of StatefulSets and Deployments are immutable, so this set
    never grows: only the job and the tier, which never change for a child."""
    return {"app.kubernetes.io/name": "kuberl", JOB_LABEL: job.name, TIER_LABEL: tier}


def common_labels(job: RLJob, tier: str) -> dict[str, str]:
    """The job's own labels, then the standard ones (which win on a clash: selectors rely on them)."""
    return {
        **job.metadata.labels,
        **selector_labels(job, tier),
        "app.kubernetes.io/instance": job.name,
        "app.kubernetes.io/component": tier,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }


def owner_reference(job: RLJob, uid: str) -> dict[str, Any]:
    """The controller reference that makes the garbage collector delete children with their RLJob."""
    if not uid:
        raise ValueError(f"RLJob {job.name!r}: metadata.uid is empty; an owner reference needs the server's uid")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": job.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def object_meta(job: RLJob, name: str, tier: str, namespace: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """metadata of a child: name, namespace, labels, the job's annotations, and the owner reference.
    `owner` is None only for `kuberl render` without a uid (a made-up uid would get the children
    garbage-collected at once, so none is better than a wrong one)."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": common_labels(job, tier)}
    annotations = {k: v for k, v in job.metadata.annotations.items() if k not in _SKIPPED_ANNOTATIONS}
    if annotations:
        meta["annotations"] = annotations
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return meta
