"""Apply the desired children idempotently with server-side apply under one field manager: what is missing
is created, what differs is applied, what already matches is not written (a restarted operator re-applies
everything without a single write). Fields that another controller manages are left out of what is applied,
so the API server leaves them to it: the sandbox Deployment's replicas once an autoscaler moves them, and
Kueue's Workload after its creation."""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

import yaml
from kubernetes.client.rest import ApiException

from kuberl.api.rljob import RLJob
from kuberl.api.spec import RLJobSpec, SandboxAutoscaler
from kuberl.api.status import RLJobStatus
from kuberl.kube import Kube, object_path
from kuberl_operator.desired import desired_objects
from kuberl_operator.images import JobImages, running_images
from kuberl_operator.job_config import build_config_map
from kuberl_operator.meta import MANAGED_BY, owner_reference
from kuberl_operator.network_policy import NetworkPeers
from kuberl_operator.pod import JOB_FILE_KEY
from kuberl_operator.secret import build_job_token_secret, build_sandbox_token_secret
from kuberl_operator.security import SandboxPodSecurity

# A running learner cannot switch model or algorithm without starting over: its checkpoints, optimizer
# state and published weights all belong to the old ones. Replica counts and limits can change.
UNSAFE_FIELDS = ("model", "algorithm")
# The operator's field manager: every field of every child it applies is owned under this name.
FIELD_MANAGER = MANAGED_BY
# Created once, never written again: the token Secrets (re-applying must never rotate a token in
# use) and Kueue's Workload (its pod sets cannot change while it is admitted: Kueue rejects it).
CREATE_ONLY = frozenset({"Secret", "Workload"})


def unsafe_changes(applied: RLJobSpec, new: RLJobSpec) -> list[str]:
    """`spec.<field>` for each unsafe field that differs from the applied spec."""
    return [f"spec.{name}" for name in UNSAFE_FIELDS if getattr(applied, name) != getattr(new, name)]


def applied_spec(config_map: dict[str, Any] | None) -> RLJobSpec | None:
    """The spec the pods run, from the job's ConfigMap (None before the first apply)."""
    job_file = applied_job_file(config_map)
    return None if job_file is None else RLJobSpec.model_validate(job_file.get("spec") or {})


def applied_job_file(config_map: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job file of the job's ConfigMap, as parsed YAML (None before the first apply)."""
    text = ((config_map or {}).get("data") or {}).get(JOB_FILE_KEY)
    return (yaml.safe_load(text) or {}) if text else None


def contains(existing: Any, desired: Any) -> bool:
    """Whether `existing` already holds every field of `desired` (server-added fields are ignored)."""
    if isinstance(desired, dict):
        return isinstance(existing, dict) and all(contains(existing.get(k), v) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(desired)
            and all(contains(e, d) for e, d in zip(existing, desired, strict=True))
        )
    return existing == desired


def learner_clock(status: RLJobStatus) -> datetime | None:
    """When a job's wall clock counts from for its learner pods; a job that ran before clockStartTime was
    recorded counts from its startTime."""
    return status.clock_start_time or status.start_time


def config_map_path(job: RLJob, namespace: str) -> str:
    return object_path(build_config_map(job, namespace, None))


def apply_children(
    kube: Kube,
    job: RLJob,
    namespace: str,
    uid: str,
    scaled_down: bool,
    new: bool = False,
    security: SandboxPodSecurity | None = None,
    peers: NetworkPeers | None = None,
    images: JobImages | None = None,
    clock_start: datetime | None = None,
) -> list[str]:
    """Apply every child; `scaled_down` renders every tier with zero replicas (suspended or finished jobs).
    A `new` job's children are applied without reading first (half the requests when a thousand jobs arrive
    at once; an apply creates what is missing). `security` is what the cluster lets sandbox pods use and
    `peers` who outside the job its NetworkPolicies admit, `images` the images and pull secrets of tiers that
    name none (the operator's configuration). Tiers that name no image keep the one their pods run (the
    applied job file's); `clock_start` the job's status.clockStartTime (learner_clock), for its learner pods.
    Returns 'Kind/name' of what was written."""
    if scaled_down:
        job = job.model_copy(update={"spec": job.spec.model_copy(update={"suspend": True})})
    applied_config = None if new else kube.get(config_map_path(job, namespace))
    images = images or JobImages.from_env()
    job = images.resolved(job, running_images(applied_job_file(applied_config)))
    owner = owner_reference(job, uid)
    written = []
    tokens = [
        build_sandbox_token_secret(job, namespace, owner, secrets.token_urlsafe(32)),
        build_job_token_secret(job, namespace, owner, secrets.token_urlsafe(32)),
    ]
    desired = desired_objects(
        job, namespace, owner=owner, security=security, peers=peers, images=images, clock_start=clock_start
    )
    for obj in [*tokens, *desired]:
        if obj["kind"] in CREATE_ONLY:
            if _create(kube, obj) is None:
                continue  # it exists: never written again
        else:
            # the job's one ConfigMap was read above
            existing = None if new else applied_config if obj["kind"] == "ConfigMap" else kube.get(object_path(obj))
            obj = _without_autoscaled_replicas(job, existing, obj, scaled_down)
            if existing is not None and contains(existing, obj):
                continue
            kube.apply(obj, FIELD_MANAGER)
        written.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return written


def _without_autoscaled_replicas(
    job: RLJob, existing: dict[str, Any] | None, obj: dict[str, Any], scaled_down: bool
) -> dict[str, Any]:
    """The sandbox Deployment's replicas belong to its autoscaler unless the job is scaled down. An HPA's
    are left out of the applied object, so the API server leaves them to the HPA; the operator's own
    autoscaler's are kept as they are once the Deployment exists, clamped to the spec's bounds."""
    if obj["kind"] != "Deployment" or scaled_down:
        return obj
    if job.spec.sandbox.autoscaler == SandboxAutoscaler.HPA:
        return {**obj, "spec": {k: v for k, v in obj["spec"].items() if k != "replicas"}}
    current = ((existing or {}).get("spec") or {}).get("replicas")
    if not isinstance(current, int):
        return obj
    bounded = min(max(current, job.spec.sandbox.min_replicas), job.spec.sandbox.max_replicas)
    return {**obj, "spec": {**obj["spec"], "replicas": bounded}}


def delete_children(kube: Kube, job: RLJob, namespace: str) -> list[str]:
    """Delete every child (the API server's garbage collector would too, through owner references; this
    also works where there is none). Returns 'Kind/name' of what was deleted."""
    tokens = [
        build_sandbox_token_secret(job, namespace, None, "unused"),
        build_job_token_secret(job, namespace, None, "unused"),
    ]
    gone = []
    for obj in [*reversed(desired_objects(job, namespace, owner=None)), *tokens]:
        if kube.delete(object_path(obj)):
            gone.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return gone


def _create(kube: Kube, obj: dict[str, Any]) -> dict[str, Any] | None:
    """Create a child that is never applied again; None when it exists already."""
    try:
        return kube.create(obj, exist_ok=True)
    except ApiException as err:
        if obj["kind"] == "Workload" and err.status in (403, 404):
            raise RuntimeError(
                f"spec.scheduling.queueName is set, but creating the Kueue Workload was refused ({err.status}): "
                "install Kueue and let the operator create Workloads (the chart's kueue.enabled), or remove "
                "queueName from the RLJob"
            ) from err
        raise
