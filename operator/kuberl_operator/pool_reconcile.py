"""The I/O around the sandbox pools per image: find the pools, read their health from the pods, plan with
kuberl_operator.pools.plan_pools, apply the replicas, say it in status.sandboxPools. Every decision is made by
the pure modules (pools, pool_health, sandbox_pools); this one reads and writes.

A pool scaled to zero keeps its objects (a Service and a Deployment, or a SandboxTemplate and a
SandboxWarmPool, at zero pods cost nothing but an entry in etcd) for POOL_DELETE_AFTER_S, so an image that
comes back within the hour finds its pool; after that its objects are deleted, and made again when the
image is wanted. Deleting the job deletes them all (owner references, and clean_up).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import pool_key, pool_service_name
from kuberl.api.spec import SandboxPoolEngine
from kuberl.api.status import SandboxPoolStatus
from kuberl.api.types import parse_duration
from kuberl.kube import Kube, collection_path, object_path
from kuberl_operator.apply import FIELD_MANAGER, contains
from kuberl_operator.demand import StartLatency
from kuberl_operator.images import JobImages
from kuberl_operator.lifecycle import Event
from kuberl_operator.meta import JOB_LABEL, SANDBOX, TIER_LABEL, owner_reference
from kuberl_operator.pool_health import ImageFailure, PoolHealth, pods_by_pool, pool_health
from kuberl_operator.pools import ImageDemand, PoolLimits, PoolsState, plan_pools
from kuberl_operator.sandbox import DEFAULT_POOL, POOL_LABEL
from kuberl_operator.sandbox_pools import (
    AGENT_SANDBOX_API,
    AGENT_SANDBOX_ENGINE,
    AGENT_SANDBOX_KINDS,
    IMAGE_ANNOTATION,
    KUBERL_ENGINE,
    pool_objects,
)
from kuberl_operator.secret import sandbox_token_secret_name
from kuberl_operator.security import SandboxPodSecurity

POOL_DELETE_AFTER_S = 3600.0
"""A pool at zero this long loses its objects (made again when its image is wanted)."""
PostEvent = Callable[[Event], None]


@dataclass
class PoolsMemory:
    """What the operator remembers of a job's pools between observations (lost on restart: the planner starts
    from PoolsState(), unusable images are read back from status.sandboxPools, the engine is asked again)."""

    planner: PoolsState = field(default_factory=PoolsState)
    unusable: dict[str, ImageFailure] = field(default_factory=dict)  # image -> why it cannot run
    engine: str | None = None
    waits: StartLatency = field(default_factory=StartLatency)  # each image's sandbox-wait histogram
    zero_since: dict[str, float] = field(default_factory=dict)  # image -> clock when its pool reached zero
    capped: int = 0  # pods the caps denied at the last plan
    images: set[str] | None = None  # the images with pool objects at the last listing (None: never listed)


@dataclass(frozen=True)
class PoolsOutcome:
    statuses: list[SandboxPoolStatus]
    capped: int
    new_failures: dict[str, ImageFailure]


def resolve_engine(kube: Kube, job: RLJob) -> str:
    """The engine spec.sandbox.pools.engine names; `auto`: agent-sandbox when the cluster serves its
    SandboxTemplate and SandboxWarmPool (API discovery), else kuberl."""
    engine = job.spec.sandbox.pools.engine
    if engine != SandboxPoolEngine.AUTO:
        return str(engine)
    served = {r.get("name") for r in (kube.get(f"/apis/{AGENT_SANDBOX_API}") or {}).get("resources") or []}
    return AGENT_SANDBOX_ENGINE if set(AGENT_SANDBOX_KINDS.values()) <= served else KUBERL_ENGINE


def pool_limits(job: RLJob, default_replicas: int) -> PoolLimits:
    """The planner's limits: spec.sandbox.maxReplicas is job-wide, so the pools share what the default pool
    leaves of it."""
    spec = job.spec.sandbox
    return PoolLimits(
        max_replicas=max(0, spec.max_replicas - default_replicas),
        max_warm_images=spec.pools.max_warm_images,
        sessions_per_pod=spec.sessions_per_pod,
        idle_timeout_s=parse_duration(spec.pools.idle_timeout),
        warm_replicas=spec.pools.warm_replicas,
    )


def existing_pools(kube: Kube, job: RLJob, namespace: str, engine: str) -> dict[str, dict[str, Any]]:
    """image -> the workload object of each of the job's image pools (Deployment or SandboxWarmPool)."""
    api, kind = ("apps/v1", "Deployment") if engine == KUBERL_ENGINE else (AGENT_SANDBOX_API, "SandboxWarmPool")
    found = {}
    for obj in kube.list(collection_path(api, kind, namespace), {JOB_LABEL: job.name, TIER_LABEL: SANDBOX}):
        meta = obj.get("metadata") or {}
        image = (meta.get("annotations") or {}).get(IMAGE_ANNOTATION)
        if image and (meta.get("labels") or {}).get(POOL_LABEL) not in (None, DEFAULT_POOL):
            found[image] = {**obj, "apiVersion": api, "kind": kind}  # a list's items may leave them out
    return found


def replicas_of(obj: dict[str, Any] | None) -> int:
    value = ((obj or {}).get("spec") or {}).get("replicas")
    return value if isinstance(value, int) else 0


def record_failures(
    memory: PoolsMemory, images: set[str], health: Mapping[str, PoolHealth], stored: list[SandboxPoolStatus]
) -> dict[str, ImageFailure]:
    """Unusable images: those the status already names (after a restart) and those whose pods fail now.
    Returns the new ones."""
    for entry in stored:
        if entry.unusable and entry.image not in memory.unusable:
            memory.unusable[entry.image] = ImageFailure(entry.reason or "Unusable", entry.message or "")
    new = {}
    for image in sorted(images):
        failure = health.get(pool_key(image), PoolHealth()).failure
        if failure is not None and image not in memory.unusable:
            memory.unusable[image] = new[image] = failure
    return new


def pool_statuses(
    job: RLJob, images: set[str], replicas: Mapping[str, int], health: Mapping[str, PoolHealth], memory: PoolsMemory
) -> list[SandboxPoolStatus]:
    """An entry per pool with pods, asked-for pods, or an unusable image, by pool name."""
    out = []
    for image in images:
        h = health.get(pool_key(image), PoolHealth())
        failure = memory.unusable.get(image)
        if not (h.pods or replicas.get(image, 0) or failure):
            continue
        out.append(
            SandboxPoolStatus(
                image=image,
                pool=pool_service_name(job.name, image),
                replicas=replicas.get(image, 0),
                ready=h.ready,
                unusable=failure is not None,
                reason=failure.reason[:256] if failure else None,
                message=failure.message[:1024] if failure else None,
            )
        )
    return sorted(out, key=lambda s: s.pool)


def apply_pool(
    kube: Kube,
    job: RLJob,
    image: str,
    replicas: int,
    existing: dict[str, Any] | None,
    namespace: str,
    uid: str,
    engine: str,
    security: SandboxPodSecurity,
    images: JobImages,
) -> list[str]:
    """Apply one pool's objects at `replicas` unless its workload already says so; returns what was written.
    A pool that does not exist is only made when it gets pods."""
    if existing is None and replicas == 0:
        return []
    objects = pool_objects(
        job,
        {image: replicas},
        namespace,
        owner_reference(job, uid),
        sandbox_token_secret_name(job),
        security,
        images,
        engine,
    )
    workload = objects[-1]
    if existing is not None and contains(existing, workload):
        return []
    written = []
    for obj in objects:
        kube.apply(obj, FIELD_MANAGER)
        written.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return written


def delete_pool(kube: Kube, job: RLJob, image: str, namespace: str, engine: str) -> None:
    """Delete an idle pool's objects (the workload first, so no pod outlives its Service)."""
    objects = pool_objects(job, {image: 0}, namespace, None, "unused", SandboxPodSecurity(), JobImages(), engine)
    for obj in reversed(objects):
        kube.delete(object_path(obj))


def reconcile_pools(
    kube: Kube,
    body: dict[str, Any],
    job: RLJob,
    pods: list[dict[str, Any]],
    demand: Mapping[str, ImageDemand] | None,
    memory: PoolsMemory,
    clock: float,
    default_replicas: int,
    stored: list[SandboxPoolStatus],
    security: SandboxPodSecurity | None = None,
    images: JobImages | None = None,
) -> PoolsOutcome:
    """One pass over a live job's image pools. `demand` None (no rollout server answered): the replicas
    hold, health and status are still read."""
    namespace, uid = body["metadata"]["namespace"], body["metadata"]["uid"]
    security, images = security or SandboxPodSecurity.from_env(), images or JobImages.from_env()
    pool_pods = pods_by_pool(pods)
    if memory.images == set() and not (demand or pool_pods or stored or memory.unusable):
        return PoolsOutcome([], memory.capped, {})  # a job on its default pool only: no request at all
    if memory.engine is None:
        memory.engine = resolve_engine(kube, job)
    existing = existing_pools(kube, job, namespace, memory.engine)
    current = {image: replicas_of(obj) for image, obj in existing.items()}
    health = {key: pool_health(group) for key, group in pool_pods.items()}
    known = set(existing) | set(demand or {}) | set(memory.unusable) | {s.image for s in stored}
    new_failures = record_failures(memory, known, health, stored)
    if demand is None:
        wanted = dict(current)
    else:
        plan = plan_pools(
            demand,
            current,
            pool_limits(job, default_replicas),
            clock,
            memory.planner,
            frozenset(memory.unusable),
        )
        memory.planner, memory.capped = plan.state, plan.capped
        wanted = {image: plan.replicas.get(image, 0) for image in known}
    present = set(existing)
    for image in sorted(known):
        replicas = wanted[image] = 0 if image in memory.unusable else wanted.get(image, 0)
        if replicas:
            memory.zero_since.pop(image, None)
        else:
            memory.zero_since.setdefault(image, clock)
        idle = clock - memory.zero_since.get(image, clock) >= POOL_DELETE_AFTER_S
        if image in existing and idle and not health.get(pool_key(image), PoolHealth()).pods:
            delete_pool(kube, job, image, namespace, memory.engine)
            present.discard(image)
            continue
        if apply_pool(kube, job, image, replicas, existing.get(image), namespace, uid, memory.engine, security, images):
            present.add(image)
    memory.zero_since = {image: t for image, t in memory.zero_since.items() if image in known}
    memory.images = present
    return PoolsOutcome(pool_statuses(job, known, wanted, health, memory), memory.capped, new_failures)


def pools_of_every_engine(kube: Kube, job: RLJob, namespace: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(engine, image, workload) of each of the job's image pools, whichever engine made it."""
    found = []
    for engine in (KUBERL_ENGINE, AGENT_SANDBOX_ENGINE):
        try:
            pools = existing_pools(kube, job, namespace, engine)
        except ApiException as err:
            if err.status in (403, 404):
                continue  # agent-sandbox's kinds are not served (or not the operator's): no pools of that engine
            raise
        found += [(engine, image, obj) for image, obj in pools.items()]
    return found


def scale_pools_to_zero(kube: Kube, job: RLJob, namespace: str) -> list[str]:
    """Every image pool of the job to zero pods (a suspended, stopped or finished job), whatever the engine."""
    written = []
    for _, _, obj in pools_of_every_engine(kube, job, namespace):
        if replicas_of(obj):
            kube.patch(object_path(obj), {"spec": {"replicas": 0}})
            written.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return written


def delete_pools(kube: Kube, job: RLJob, namespace: str) -> list[str]:
    """Delete every image pool of the job (its deletion; owner references would do it too)."""
    gone = []
    for engine, image, _ in pools_of_every_engine(kube, job, namespace):
        delete_pool(kube, job, image, namespace, engine)
        gone.append(f"pool/{pool_service_name(job.name, image)}")
    return gone
