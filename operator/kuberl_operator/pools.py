"""Sandbox pools, one per environment image: (demand per image, replicas, limits, time, state) -> replicas. Pure.

Tasks that name their own container image (SWE-bench: one image per instance) cannot share one sandbox
Deployment, so the operator keeps a pool (a Deployment of multi-session sandbox pods) per image and calls
`plan_pools` on every observation (about every 3 s) with the rollout tier's demand per image. Time and the
remembered state are inputs, as in `autoscale.recommend`; `PoolsState()` is always a safe start.

The rules, and why:

- Each image with running or queued episodes is scaled by the single-pool autoscaler (`recommend`) on
  sessions wanted = running + queued: one set of rules (headroom, scale up at once, stabilised scale-down)
  for one pool or five hundred.
- An image whose episodes the learner has announced (`upcoming`) gets warm pods before they are queued:
  pulling an SWE image takes tens of seconds, and an episode that waits for it holds up its group and the
  training step. As many pods as the announced episodes need, at least `warm_replicas` (0 turns warm-up off).
- An image used within `idle_timeout_s` keeps up to `warm_replicas` of the pods it has (a retry or the next
  group of the same task finds them ready); none are started for it. After `idle_timeout_s` with no running,
  queued or upcoming episode its pool goes to zero at once: the timeout is the stabilisation window here, and
  most of 500 images are idle most of the time.
- An image never goes below the pods its running sessions need (ceil(running / sessions_per_pod)): scaling
  it down would kill episodes in flight.
- An unusable image (its pods cannot start: the pull fails, the image is rejected) gets no pods; its
  episodes fail on the rollout side instead of holding pods that never become ready.
- The caps: at most `max_replicas` pods over all pools and at most `max_warm_images` images with pods.
  Pods are granted in priority order: pods that running sessions need, then pods for queued episodes, then
  warm-up for upcoming ones, then idle-warm pods. A pool is never cut below its running sessions to warm
  another image. Within a class, images that already have pods come first (a pod in place costs no start
  and no new image slot), then the larger demand, then the image name: the plan is deterministic.
  A lowered `max_replicas` is obeyed at once, running sessions included, as in the single-pool autoscaler.

Only images with demand, pods or memory are visited, so a call costs the active images, not the dataset.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from kuberl_operator.autoscale import SandboxDemand, ScalerState, ScalingPolicy, needed_replicas, recommend


@dataclass(frozen=True)
class ImageDemand:
    """The rollout tier's demand for one image."""

    running: int = 0  # episodes holding a session on this image now
    queued: int = 0  # episodes accepted by the rollout tier, waiting for a session of this image
    upcoming: int = 0  # episodes the learner will submit next for this image (announced, not yet queued)
    start_latency_s: float | None = None  # seconds to open a session of this image; None: not measured


@dataclass(frozen=True)
class PoolLimits:
    max_replicas: int  # job-wide cap on sandbox pods over all pools
    max_warm_images: int  # cap on distinct images that have pods at once
    sessions_per_pod: int
    idle_timeout_s: float  # a pool with no running/queued/upcoming episode this long goes to zero
    warm_replicas: int = 1  # pods kept for an image that has only upcoming demand (or was used within idle_timeout)


@dataclass(frozen=True)
class PoolMemory:
    """What the planner remembers of one image."""

    last_active_s: float  # the last call that saw a running, queued or upcoming episode of it
    scaler: ScalerState = field(default_factory=ScalerState)


@dataclass(frozen=True)
class PoolsState:
    """What the planner remembers between calls; `PoolsState()` is always a safe start: an image with pods and
    no memory counts as used now, so it is kept warm for one more idle_timeout, never cut early."""

    pools: Mapping[str, PoolMemory] = field(default_factory=dict)  # never mutated: each call makes a new one


class PoolReason(StrEnum):
    """Why an image has the replicas it has; images with running or queued episodes carry the autoscaler's
    own reason (autoscale.ScaleReason: Demand, ScaleDown, Stabilising, ...)."""

    UPCOMING = "Upcoming"  # warm pods for episodes the learner has announced
    WARM = "Warm"  # used within idle_timeout: the pods it has are kept
    IDLE = "Idle"  # no episode for idle_timeout (or none and no pods): zero
    CAP = "Cap"  # fewer than wanted: maxReplicas or maxWarmImages
    UNUSABLE = "Unusable"  # its pods cannot start


@dataclass(frozen=True)
class PoolPlan:
    replicas: dict[str, int]  # image -> replicas wanted (images absent = 0)
    reasons: dict[str, str]  # image -> short reason, for every image visited (zeros included)
    state: PoolsState
    capped: int  # pods wanted but not granted because of the caps (for a metric/alert)


DEFAULT_POLICY = ScalingPolicy()
UNCAPPED = 1_000_000

# Priority classes of the pods an image wants, granted in this order under the caps.
RUNNING, QUEUED, UPCOMING, IDLE_WARM = 0, 1, 2, 3


@dataclass(frozen=True)
class _Want:
    """One image's wish before the caps: pods, the part its running sessions need, its class, why."""

    image: str
    pods: int
    running_pods: int
    rank: int  # class of the pods beyond running_pods
    demand: int  # running + queued + upcoming, for the order within a class
    current: int
    reason: str
    memory: PoolMemory | None


def plan_pools(
    demand: Mapping[str, ImageDemand],
    current: Mapping[str, int],
    limits: PoolLimits,
    now: float,
    state: PoolsState,
    unusable: frozenset[str] = frozenset(),
    policy: ScalingPolicy = DEFAULT_POLICY,
) -> PoolPlan:
    """Replicas per image, why, the pods the caps held back, and the state for the next call.

    `current` is each pool's spec.replicas (pods asked for, ready or not); `now` is seconds on a clock that
    does not go backwards while the state lives.
    """
    if limits.sessions_per_pod < 1 or limits.max_replicas < 0 or limits.max_warm_images < 0:
        raise ValueError(f"limits {limits}")
    if limits.warm_replicas < 0 or limits.idle_timeout_s < 0:
        raise ValueError(f"limits {limits}")
    images = {i for i, d in demand.items() if d.running or d.queued or d.upcoming}
    images |= {i for i, n in current.items() if n > 0} | set(state.pools)
    wants = [
        _want(image, demand.get(image, ImageDemand()), current.get(image, 0), limits, now, state, unusable, policy)
        for image in sorted(images)
    ]
    granted = _grant(wants, limits)
    replicas: dict[str, int] = {}
    reasons: dict[str, str] = {}
    memory: dict[str, PoolMemory] = {}
    capped = 0
    for want in wants:
        pods = granted.get(want.image, 0)
        capped += want.pods - pods
        if pods:
            replicas[want.image] = pods
        reasons[want.image] = PoolReason.CAP if pods < want.pods else want.reason
        if want.memory is not None:
            memory[want.image] = _settled(want.memory, state.pools.get(want.image), want.current, pods, now)
    return PoolPlan(replicas, reasons, PoolsState(memory), capped)


def _want(
    image: str,
    d: ImageDemand,
    current: int,
    limits: PoolLimits,
    now: float,
    state: PoolsState,
    unusable: frozenset[str],
    policy: ScalingPolicy,
) -> _Want:
    """One image's pods before the caps; its memory for the next call (None: forget it)."""
    prior = state.pools.get(image)
    wanted = max(0, d.running) + max(0, d.queued)
    total = wanted + max(0, d.upcoming)
    # No memory of an image that has pods (a restart): treat it as used now rather than cut it early.
    last = now if total or prior is None else prior.last_active_s
    recent = now - last < limits.idle_timeout_s
    if image in unusable:
        memory = PoolMemory(last) if total or recent or current else None
        return _Want(image, 0, 0, IDLE_WARM, total, current, PoolReason.UNUSABLE, memory)
    if not recent and not total:
        # kept until the pods are gone: forgetting earlier would make them look freshly used (see above)
        return _Want(image, 0, 0, IDLE_WARM, 0, current, PoolReason.IDLE, PoolMemory(last) if current else None)
    per_pod = limits.sessions_per_pod
    running_pods = math.ceil(max(0, d.running) / per_pod)
    floor = running_pods
    if d.upcoming > 0 and limits.warm_replicas > 0:
        floor = max(floor, limits.warm_replicas, needed_replicas(d.upcoming, per_pod, 0.0))
    elif recent:
        floor = max(floor, min(limits.warm_replicas, current))  # keeps warm pods, starts none
    rec = recommend(
        SandboxDemand(wanted, max(0, d.running), d.start_latency_s),
        current,
        min_replicas=floor,
        max_replicas=max(UNCAPPED, floor),  # the caps hold over all pools, in _grant, so "Cap" says why
        sessions_per_pod=per_pod,
        now=now,
        state=prior.scaler if prior else ScalerState(),
        policy=policy,
    )
    if wanted:
        rank, reason = QUEUED, str(rec.reason)
    elif d.upcoming > 0:
        rank, reason = UPCOMING, PoolReason.UPCOMING
    else:
        rank, reason = IDLE_WARM, PoolReason.WARM if rec.replicas else PoolReason.IDLE
    pods = rec.replicas
    return _Want(image, pods, min(running_pods, pods), rank, total, current, reason, PoolMemory(last, rec.state))


def _grant(wants: list[_Want], limits: PoolLimits) -> dict[str, int]:
    """Pods per image under the caps, claims granted in priority order (see the module docstring)."""
    claims = [(RUNNING, w, w.running_pods) for w in wants if w.running_pods]
    claims += [(w.rank, w, w.pods - w.running_pods) for w in wants if w.pods > w.running_pods]
    claims.sort(key=lambda c: (c[0], c[1].current == 0, -c[1].demand, c[1].image))
    granted: dict[str, int] = {}
    left = limits.max_replicas
    for _, want, pods in claims:
        if left == 0:
            break
        if want.image not in granted and len(granted) >= limits.max_warm_images:
            continue
        take = min(pods, left)
        granted[want.image] = granted.get(want.image, 0) + take
        left -= take
    return granted


def _settled(memory: PoolMemory, prior: PoolMemory | None, current: int, granted: int, now: float) -> PoolMemory:
    """The image's memory with the scaler's scale times set by what was granted, not what was recommended
    (a capped scale-up that did not happen must not start the latency cooldown)."""
    before = prior.scaler if prior else ScalerState()
    scaler = replace(
        memory.scaler,
        last_scale_up_s=now if granted > current else before.last_scale_up_s,
        last_scale_down_s=now if granted < current else before.last_scale_down_s,
    )
    return replace(memory, scaler=scaler)
