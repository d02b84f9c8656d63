"""What the handlers do, one function each: apply a job, observe and drive it, clean it up. The I/O sits
here; every decision is made by the pure modules (desired, apply.contains, observe, lifecycle)."""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from kuberl.api.rljob import RLJob
from kuberl.api.spec import SandboxAutoscaler
from kuberl.api.status import TERMINAL_PHASES, Phase, Reason, RLJobStatus
from kuberl.kube import Kube, collection_path, rljob_path
from kuberl_operator import queueing
from kuberl_operator.apply import (
    applied_spec,
    apply_children,
    config_map_path,
    delete_children,
    learner_clock,
    unsafe_changes,
)
from kuberl_operator.autoscale import SandboxDemand, ScalerState, recommend
from kuberl_operator.demand import StartLatency, scrape_demand
from kuberl_operator.images import JobImages
from kuberl_operator.lifecycle import (
    Action,
    ActionKind,
    Decision,
    Event,
    Observed,
    next_state,
    set_condition,
    should_write,
)
from kuberl_operator.meta import JOB_LABEL, LEARNER, MANAGED_BY, QUEUE, SANDBOX, TIER_LABEL, child_name
from kuberl_operator.network_policy import NetworkPeers
from kuberl_operator.observe import (
    NodeCapacity,
    desired_replicas,
    gpus_by_tier,
    learner_stop,
    sandbox_start_failure,
    tier_states,
)
from kuberl_operator.operator_metrics import pools as pool_metrics
from kuberl_operator.pool_reconcile import PoolsMemory, delete_pools, reconcile_pools, scale_pools_to_zero
from kuberl_operator.security import SandboxPodSecurity

SPEC_CHANGE_REFUSED = "SpecChangeRefused"
_LIVE_PHASES = frozenset({Phase.INITIALIZING, Phase.RUNNING, Phase.RECOVERING})
KOPF_PREFIX = "operator.kuberl.io"  # where kopf keeps its progress and last-handled spec (annotations)
PostEvent = Callable[[Event], None]
_PARSED_MAX = 4096
_parsed: dict[str, RLJob] = {}  # the manifest as canonical JSON -> the job as parsed (never mutated)
_STATUS_KEYS = {f.alias or name for name, f in RLJobStatus.model_fields.items()}


@dataclass
class Memory:
    """What the operator remembers about a job between observations (lost on restart, by design: every
    field has a safe value to start from)."""

    metered_at: datetime | None = None
    last_step: int | None = None
    last_progress: datetime | None = None
    scaler: ScalerState = field(default_factory=ScalerState)  # the sandbox autoscaler's window
    start_latency: StartLatency = field(default_factory=StartLatency)
    autoscaled_at: float | None = None  # time.monotonic() of the last autoscaling decision
    pools: PoolsMemory = field(default_factory=PoolsMemory)  # the per-image pools' planner and failures
    pools_parked: bool = False  # the image pools were taken to zero since the job stopped being live


def post_event(kube: Kube, body: dict[str, Any], event: Event, now: datetime) -> None:
    """A core/v1 Event on the RLJob, named `<job>.<random hex>` like kubectl's: unique without relying on
    the server's generateName (which API emulators lack)."""
    meta = body["metadata"]
    stamp = now.isoformat().replace("+00:00", "Z")
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": event.type,
            "reason": event.reason,
            "message": event.message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
        }
    )


def fresh(kube: Kube, body: dict[str, Any]) -> dict[str, Any]:
    """The job as stored now (the watch may still be delivering a write made a moment ago)."""
    meta = body["metadata"]
    return kube.get(rljob_path(meta["namespace"], meta["name"])) or body


def parse_job(body: dict[str, Any]) -> RLJob:
    """The RLJob, validated with the project's models (status and server metadata set aside). Parsed once
    per content, not per stored version: the status, kopf's annotations and the finalizer change the
    resourceVersion four times while a job starts, and its spec not at all (and the emulated API server
    keeps no metadata.generation to key on)."""
    manifest = _manifest(body)
    key = json.dumps(manifest, sort_keys=True, default=str)  # ~1 % of a validation's cost
    if (job := _parsed.get(key)) is not None:
        return job
    job = RLJob.from_manifest(manifest)
    if len(_parsed) >= _PARSED_MAX:
        _parsed.clear()  # old versions are never asked for again; a full clear is the cheap bound
    _parsed[key] = job
    return job


def _manifest(body: dict[str, Any]) -> dict[str, Any]:
    meta = body.get("metadata") or {}
    manifest = {k: body[k] for k in ("apiVersion", "kind", "spec") if k in body}
    manifest["metadata"] = {k: meta[k] for k in ("name", "namespace", "labels") if k in meta}
    # kopf's own bookkeeping annotations change as it works: copied onto children they would re-patch them all
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if not k.startswith(KOPF_PREFIX + "/")}
    if annotations:
        manifest["metadata"]["annotations"] = annotations
    return manifest


def current_status(body: dict[str, Any]) -> RLJobStatus:
    """The stored status (fields other writers added are ignored)."""
    raw = {k: v for k, v in (body.get("status") or {}).items() if k in _STATUS_KEYS}
    try:
        return RLJobStatus.model_validate(raw)
    except ValidationError:
        return RLJobStatus()


def write_status(kube: Kube, body: dict[str, Any], old: RLJobStatus, new: RLJobStatus) -> None:
    """Merge-patch the fields that changed, and only those: the learner writes its own (step, checkpoint)
    into the same status and must not be overwritten with what this operator read earlier."""
    before = old.model_dump(mode="json", by_alias=True, exclude_none=True)
    after = new.model_dump(mode="json", by_alias=True, exclude_none=True)
    patch: dict[str, Any] = {k: v for k, v in after.items() if before.get(k) != v}
    patch.update({k: None for k in before if k not in after})
    if patch:
        meta = body["metadata"]
        kube.patch(rljob_path(meta["namespace"], meta["name"]) + "/status", {"status": patch})


def fail_invalid(kube: Kube, body: dict[str, Any], err: ValidationError, now: datetime, post: PostEvent) -> RLJobStatus:
    """An invalid spec fails the job at once, saying which fields are wrong. Returns the status."""
    old = current_status(body)
    if old.phase == Phase.FAILED and old.reason == Reason.INVALID_SPEC:
        return old
    problems = "; ".join(
        f"spec.{'.'.join(str(p) for p in e['loc'][1:])}: {e['msg']}"
        if e["loc"][:1] == ("spec",)
        else f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
        for e in err.errors()
    )
    message = f"invalid RLJob: {problems}"[:32768]
    new = old.model_copy(
        update={"phase": Phase.FAILED, "reason": Reason.INVALID_SPEC, "message": message, "completion_time": now}
    )
    write_status(kube, body, old, new)
    post(Event("Warning", str(Reason.INVALID_SPEC), message))
    return new


def apply_job(
    kube: Kube,
    body: dict[str, Any],
    now: datetime,
    post: PostEvent,
    new: bool = False,
    security: SandboxPodSecurity | None = None,
    first_try: bool = False,
    peers: NetworkPeers | None = None,
    images: JobImages | None = None,
) -> list[str]:
    """Apply the children unless the spec change is unsafe for a started job; then say why in a condition.
    A `new` job (the create handler) has no applied spec to compare with yet. `security`: what the cluster
    lets sandbox pods use; `peers`: who outside the job its NetworkPolicies admit; `images`: the images and pull
    secrets of tiers that name none.

    The job is read afresh first: the phase decides the replicas, and a stale one would undo a scale-down.
    Not on a new job's `first_try`: until its children exist the state machine can only have moved it to
    Initializing or Suspended (neither scales down; suspension is read from the spec, admission from Kueue),
    so the delivered body decides the same, and a thousand creates save a thousand reads. A retried create
    may follow a job that timed out, and reads it."""
    if not (new and first_try):
        body = fresh(kube, body)
    job, namespace = parse_job(body), body["metadata"]["namespace"]
    old = current_status(body)
    applied = None if new else applied_spec(kube.get(config_map_path(job, namespace)))
    refused = unsafe_changes(applied, job.spec) if applied is not None and old.phase != Phase.PENDING else []
    if refused:
        message = (
            f"{', '.join(refused)} cannot change once the job has started (the checkpoints belong to "
            f"the applied ones); revert the change or create a new RLJob"
        )
    else:
        message = "the spec is applied"
    if refused or any(c.type == SPEC_CHANGE_REFUSED for c in old.conditions):
        reason = "UnsafeSpecChange" if refused else "Applied"
        conditions = set_condition(old.conditions, SPEC_CHANGE_REFUSED, bool(refused), reason, message, now)
        new = old.model_copy(update={"conditions": conditions})
        if new != old:
            write_status(kube, body, old, new)
            if refused:
                post(Event("Warning", SPEC_CHANGE_REFUSED, message))
    if refused:
        return []
    scaled_down = job.spec.suspend or old.phase in TERMINAL_PHASES or admission(kube, job, namespace) is False
    uid = body["metadata"]["uid"]
    written = apply_children(
        kube,
        job,
        namespace,
        uid,
        scaled_down,
        new=new,
        security=security,
        peers=peers,
        images=images,
        clock_start=learner_clock(old),
    )
    return written + (scale_pools_to_zero(kube, job, namespace) if scaled_down and not new else [])


def drive(
    kube: Kube,
    body: dict[str, Any],
    pods: list[dict[str, Any]],
    memory: Memory,
    now: datetime,
    post: PostEvent,
    nodes: Mapping[str, NodeCapacity] | None = None,
    security: SandboxPodSecurity | None = None,
    peers: NetworkPeers | None = None,
    images: JobImages | None = None,
) -> RLJobStatus:
    """One observation of a job and its pods (from the operator's pod index, not a list per job): run the
    state machine, act, post events, write the status.

    Most observations change nothing and cost no request. One that would act or write is decided again on
    the job read afresh: a status written a moment ago (by this operator or the learner) may not have
    arrived through the watch yet, and a decision on an older one would undo it (conditions are one list)."""
    if current_status(body).phase in TERMINAL_PHASES:
        return current_status(body)  # final: no stored status can be newer than a terminal one
    job = parse_job(body)
    admitted = admission(kube, job, body["metadata"]["namespace"])
    old, decision, observed = _decide(body, pods, nodes or {}, admitted, memory, now)
    if not (decision.actions or decision.events or should_write(old, decision.status, observed)):
        if memory.metered_at is None:
            memory.metered_at = now  # the stored counters are as of now: meter from here
        return old
    body = fresh(kube, body)
    old, decision, observed = _decide(body, pods, nodes or {}, admitted, memory, now)
    if old.phase in TERMINAL_PHASES:
        return old
    job = parse_job(body)
    for action in decision.actions:
        _act(kube, body, job, pods, action, learner_clock(decision.status), security, peers, images)
    if should_write(old, decision.status, observed):
        write_status(kube, body, old, decision.status)
        memory.metered_at = now
    elif memory.metered_at is None:
        memory.metered_at = now
    for event in decision.events:
        post(event)
    return decision.status


def autoscale_sandbox(
    kube: Kube,
    body: dict[str, Any],
    pods: list[dict[str, Any]],
    memory: Memory,
    post: PostEvent,
    clock: float,
    interval_s: float,
    security: SandboxPodSecurity | None = None,
    images: JobImages | None = None,
    status: RLJobStatus | None = None,
) -> RLJobStatus | None:
    """Every `interval_s` seconds (of `clock`) for a live job: the rollout tier's demand -> the default pool's
    replicas (kuberl_operator.autoscale.recommend, when the operator scales it) and each image's pool
    (pool_reconcile) -> status.sandboxReplicas and status.sandboxPools. Returns the status written (None when
    nothing was decided). `status`: the job's status as this pass left it (`drive` may have just stopped the
    job, which `body` does not show yet); unset: body's."""
    status, job = status or current_status(body), parse_job(body)
    if not _live(kube, body, job, status, memory):
        return None
    if memory.autoscaled_at is not None and clock - memory.autoscaled_at < interval_s:
        return None
    memory.autoscaled_at = clock
    demand = scrape_demand(pods, memory.start_latency, memory.pools.waits)
    meta = body["metadata"]
    deployment = f"{collection_path('apps/v1', 'Deployment', meta['namespace'])}/{child_name(job, SANDBOX)}"
    current = ((kube.get(deployment) or {}).get("spec") or {}).get("replicas")
    if not isinstance(current, int):
        return None  # no Deployment yet
    default = current
    if demand is not None and job.spec.sandbox.autoscaler == SandboxAutoscaler.OPERATOR:
        default = _scale_default_pool(kube, deployment, job, demand.default, current, memory, post, clock)
    outcome = reconcile_pools(
        kube,
        body,
        job,
        pods,
        demand.images if demand else None,
        memory.pools,
        clock,
        default,
        status.sandbox_pools,
        security,
        images,
    )
    for image, failure in outcome.new_failures.items():
        pool_metrics.image_failed(meta["namespace"], meta["name"], failure.reason)
        post(Event("Warning", "SandboxImageUnusable", f"image {image}: {failure.reason}: {failure.message}"))
    pool_metrics.observe(meta["namespace"], meta["name"], outcome.statuses, outcome.capped)
    update: dict[str, Any] = {"sandbox_pools": outcome.statuses}
    if job.spec.sandbox.autoscaler == SandboxAutoscaler.OPERATOR and demand is not None:
        update["sandbox_replicas"] = default
    new = status.model_copy(update=update)
    write_status(kube, body, status, new)
    return new


def _live(kube: Kube, body: dict[str, Any], job: RLJob, status: RLJobStatus, memory: Memory) -> bool:
    """Whether the job is live (its sandbox tiers are scaled); a stopped job's pools are parked at zero once."""
    if status.phase in _LIVE_PHASES:
        memory.pools_parked = False
        return True
    if memory.pools.images and not memory.pools_parked:
        # a pass that read the job while it was still live may have scaled a pool after the stop took
        # them to zero (the timer and the stop run apart): the first pass that sees it stopped parks them
        scale_pools_to_zero(kube, job, body["metadata"]["namespace"])
        memory.pools_parked = True
    return False


def _scale_default_pool(
    kube: Kube,
    deployment: str,
    job: RLJob,
    demand: SandboxDemand,
    current: int,
    memory: Memory,
    post: PostEvent,
    clock: float,
) -> int:
    """The default pool's replicas from its demand (the tasks that name no image); returns them."""
    spec = job.spec.sandbox
    rec = recommend(
        demand,
        current,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        sessions_per_pod=spec.sessions_per_pod,
        now=clock,
        state=memory.scaler,
    )
    memory.scaler = rec.state
    if rec.replicas != current:
        kube.patch(deployment, {"spec": {"replicas": rec.replicas}})
        post(
            Event(
                "Normal",
                "SandboxScaled",
                f"sandbox pods {current} -> {rec.replicas} ({rec.reason}): "
                f"{demand.sessions_wanted} sessions wanted, {spec.sessions_per_pod} per pod",
            )
        )
    return rec.replicas


def _decide(
    body: dict[str, Any],
    pods: list[dict[str, Any]],
    nodes: Mapping[str, NodeCapacity],
    admitted: bool | None,
    memory: Memory,
    now: datetime,
) -> tuple[RLJobStatus, Decision, Observed]:
    job, meta = parse_job(body), body["metadata"]
    old = current_status(body)
    if memory.last_step != old.step or memory.last_progress is None:
        memory.last_step, memory.last_progress = old.step, now
    gpus, spot_gpus = gpus_by_tier(pods, nodes)
    observed = Observed(
        now=now,
        tiers=tier_states(pods, desired_replicas(job, job.spec.suspend or admitted is False), nodes),
        gpus_in_use=sum(gpus.values()),
        gpus_by_tier=gpus,
        spot_gpus_by_tier=spot_gpus,
        metered_at=memory.metered_at,
        last_progress=memory.last_progress,
        learner_stop=learner_stop(body.get("status") or {}),
        admitted=admitted,
        sandbox_problem=sandbox_start_failure(pods),
    )
    return old, next_state(job.spec, old, observed, generation=meta.get("generation")), observed


def admission(kube: Kube, job: RLJob, namespace: str) -> bool | None:
    """Kueue's admission of a queued job (one read of its Workload); None for a job that is not queued."""
    if not job.spec.scheduling.queue_name:
        return None
    workload = f"{collection_path(queueing.WORKLOAD_API_VERSION, 'Workload', namespace)}/{child_name(job, QUEUE)}"
    return queueing.admitted(kube.get(workload))


def _act(
    kube: Kube,
    body: dict[str, Any],
    job: RLJob,
    pods: list[dict[str, Any]],
    action: Action,
    clock_start: datetime | None,
    security: SandboxPodSecurity | None,
    peers: NetworkPeers | None,
    images: JobImages | None,
) -> None:
    """Carry out one action. `clock_start` goes into the learner pods the action makes (learner_clock)."""
    namespace, uid = body["metadata"]["namespace"], body["metadata"]["uid"]
    collection = collection_path("v1", "Pod", namespace)
    options = {"security": security, "peers": peers, "images": images, "clock_start": clock_start}
    apply = functools.partial(apply_children, kube, job, namespace, uid, **options)
    if action.kind == ActionKind.SCALE_TO_ZERO:
        # the learner's preStop hook writes the final checkpoint, bounded by its termination grace period
        apply(scaled_down=True)
        scale_pools_to_zero(kube, job, namespace)  # the image pools' replicas are the planner's, not applied
    elif action.kind == ActionKind.RESTART_LEARNER_GANG:
        # the gang made from the template counts the job's wall clock from its start, not from its own (OnDelete:
        # the template's change reaches only the pods made after it)
        apply(scaled_down=False)
        # torch.distributed cannot replace one rank: every rank restarts and resumes from the checkpoint
        for pod in pods:
            if (pod["metadata"].get("labels") or {}).get(TIER_LABEL) == LEARNER:
                kube.delete(f"{collection}/{pod['metadata']['name']}")
    elif action.kind == ActionKind.APPLY:
        apply(scaled_down=False)
    elif action.kind == ActionKind.REPLACE_PODS:
        for name in action.pods:
            kube.delete(f"{collection}/{name}")


def clean_up(kube: Kube, body: dict[str, Any]) -> list[str]:
    """Delete the children and the job's pods (which the garbage collector would delete with them)."""
    meta = body["metadata"]
    job = parse_job(body)
    gone = delete_pools(kube, job, meta["namespace"]) + delete_children(kube, job, meta["namespace"])
    pods = collection_path("v1", "Pod", meta["namespace"])
    for pod in kube.list(pods, {JOB_LABEL: job.name}):
        if kube.delete(f"{pods}/{pod['metadata']['name']}"):
            gone.append(f"Pod/{pod['metadata']['name']}")
    return gone
