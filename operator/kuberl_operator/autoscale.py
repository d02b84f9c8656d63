"""Sandbox autoscaling: (demand, replicas, bounds, time, remembered state) -> replicas. Pure.

The operator calls `recommend` on every observation of a job (about every 3 s) with the sandbox demand the
rollout tier reports (summed over its pods) and scales the sandbox Deployment to `Recommendation.replicas`.
Time is an input, never read here, and so is the state: a small frozen value the caller keeps per job and
passes back. It may be lost (an operator restart): a fresh `ScalerState()` is always safe, it only holds off
a scale-down for one stabilisation window.

The shape follows the Kubernetes HPA: scale up at once, scale down to the highest recommendation of a
trailing window and by bounded steps, clamp to [min, max] last. What differs is the signal: sessions wanted
by the rollout tier (running and queued episodes), which moves before CPU does, plus a session start latency
that says when the pods are short of capacity the counts do not show.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum


@dataclass(frozen=True)
class SandboxDemand:
    """What the rollout tier reports, summed over its pods."""

    sessions_wanted: int  # episodes holding a session plus those queued for one
    sessions_open: int  # sessions open now on the sandbox pods
    start_latency_s: float | None = None  # seconds to open a session (p90 or mean); None: not measured


@dataclass(frozen=True)
class ScalingPolicy:
    """The knobs, with defaults for agentic RL rollouts (batches of episodes every minute or so)."""

    # Room above what is wanted now: the rollout loop submits the next groups while the last ones finish,
    # and a pod takes tens of seconds to become ready, so capacity sized to the present is late by one pod
    # start for every rise.
    headroom: float = 0.25
    # A scale-down follows the highest recommendation of this trailing window (HPA's
    # --horizontal-pod-autoscaler-downscale-stabilization, default 5 min). Demand between two batches falls
    # to nearly nothing; without the window every gap between batches would remove pods the next batch needs.
    scale_down_window_s: float = 300.0
    # At most this fraction of the pods goes in one scale-down step (at least one pod), and steps are at
    # least scale_down_period_s apart: a wrong scale-down is then cheap to undo, and the pods that go take
    # their open sessions with them (a Deployment does not know which pods are idle).
    scale_down_max_fraction: float = 0.5
    scale_down_period_s: float = 60.0
    # No scale-down that would remove less than this fraction of the pods (HPA's tolerance is 10%): batch
    # sizes vary, so the window's highest recommendation wanders by a pod or two; following it down saves
    # little CPU and is undone by the next large batch, a pod start late.
    scale_down_tolerance: float = 0.15
    # Session starts slower than this while the pods are this full mean the counts understate the need
    # (sessions heavier than sessions_per_pod assumes, pods slow to accept): add latency_extra_fraction more
    # pods (at least one). Not again within latency_cooldown_s: new pods need time to become ready and the
    # latency measure lags, so without it every observation would add pods for the same slow start.
    slow_start_s: float = 5.0
    saturated_fraction: float = 0.9
    latency_extra_fraction: float = 0.25
    latency_cooldown_s: float = 60.0


@dataclass(frozen=True)
class ScalerState:
    """What one job's scaler remembers between calls; `ScalerState()` is the safe start."""

    # (time, recommendation) of the stabilisation window, kept as a monotonic queue: recommendations fall
    # from first to last, so the first is the window's maximum (a newer, higher one makes older, lower ones
    # irrelevant, and they are dropped). Empty: nothing is known, and the current replicas are taken as the
    # recommendation of this moment, as the HPA does for a target it has not seen before.
    window: tuple[tuple[float, int], ...] = ()
    last_scale_up_s: float | None = None
    last_scale_down_s: float | None = None


class ScaleReason(StrEnum):
    DEMAND = "Demand"  # scaled up to the sessions wanted plus headroom
    START_LATENCY = "StartLatency"  # scaled up further: sessions start slowly on saturated pods
    SCALE_DOWN = "ScaleDown"  # a scale-down step the window allows
    STABILISING = "Stabilising"  # fewer pods would do; the window, tolerance or step period holds them
    BOUNDS = "Bounds"  # clamped into [minReplicas, maxReplicas]
    STEADY = "Steady"  # nothing to change


@dataclass(frozen=True)
class Recommendation:
    replicas: int
    reason: ScaleReason
    state: ScalerState  # pass it to the next call for the same job


def needed_replicas(sessions_wanted: int, sessions_per_pod: int, headroom: float) -> int:
    """Pods for the sessions wanted plus headroom, before any bound."""
    # rounded first so that float noise (110.00000000000001) never asks for a pod more
    return math.ceil(round(max(0, sessions_wanted) * (1.0 + headroom) / sessions_per_pod, 9))


def recommend(
    demand: SandboxDemand,
    current_replicas: int,
    *,
    min_replicas: int,
    max_replicas: int,
    sessions_per_pod: int,
    now: float,
    state: ScalerState,
    policy: ScalingPolicy = ScalingPolicy(),
) -> Recommendation:
    """Replicas for the sandbox Deployment, why, and the state for the next call.

    `current_replicas` is the Deployment's spec.replicas (pods asked for, ready or not), so pods still
    starting count as capacity on the way and are not asked for twice. `now` is seconds on a clock that
    does not go backwards while the state lives (time.monotonic() in one operator process).
    """
    if sessions_per_pod < 1 or min_replicas < 0 or max_replicas < min_replicas:
        raise ValueError(f"bounds [{min_replicas}, {max_replicas}], sessionsPerPod {sessions_per_pod}")

    def clamp(n: int) -> int:
        return min(max_replicas, max(min_replicas, n))

    unbounded, reason = _wanted(demand, current_replicas, sessions_per_pod, now, state, policy)
    wanted = clamp(unbounded)
    seed = ((now, clamp(current_replicas)),)
    window = _remember(state.window or seed, now, wanted, policy.scale_down_window_s)
    stable = window[0][1]  # the highest recommendation of the window, this one included

    if wanted > current_replicas:
        # Up in one step to all that is needed: creeping up pod by pod leaves episodes queued for a pod start
        # at each step, and the trajectories they belong to hold up the next training step.
        target = wanted
        reason = ScaleReason.BOUNDS if wanted != unbounded else reason
    elif stable >= current_replicas:
        target = current_replicas
        reason = ScaleReason.STEADY if wanted == current_replicas else ScaleReason.STABILISING
    elif current_replicas - stable <= policy.scale_down_tolerance * current_replicas or (
        state.last_scale_down_s is not None and now - state.last_scale_down_s < policy.scale_down_period_s
    ):
        target, reason = current_replicas, ScaleReason.STABILISING
    else:
        step = max(1, math.floor(current_replicas * policy.scale_down_max_fraction))
        target, reason = max(stable, current_replicas - step), ScaleReason.SCALE_DOWN
    # The spec's bounds win over everything, the window included: a lowered maxReplicas is obeyed at once.
    replicas = clamp(target)
    if replicas == max_replicas < current_replicas or replicas == min_replicas > current_replicas:
        reason = ScaleReason.BOUNDS
    new_state = replace(
        state,
        window=window,
        last_scale_up_s=now if replicas > current_replicas else state.last_scale_up_s,
        last_scale_down_s=now if replicas < current_replicas else state.last_scale_down_s,
    )
    return Recommendation(replicas, reason, new_state)


def _wanted(
    demand: SandboxDemand, current: int, sessions_per_pod: int, now: float, state: ScalerState, policy: ScalingPolicy
) -> tuple[int, ScaleReason]:
    """This moment's recommendation, unbounded and unstabilised, and its reason."""
    needed = needed_replicas(demand.sessions_wanted, sessions_per_pod, policy.headroom)
    cooled = state.last_scale_up_s is None or now - state.last_scale_up_s >= policy.latency_cooldown_s
    saturated = current > 0 and demand.sessions_open >= policy.saturated_fraction * current * sessions_per_pod
    slow = demand.start_latency_s is not None and demand.start_latency_s > policy.slow_start_s
    if slow and saturated and cooled:
        extra = max(1, math.ceil(current * policy.latency_extra_fraction))
        return max(needed, current) + extra, ScaleReason.START_LATENCY
    return needed, ScaleReason.DEMAND


def _remember(
    window: tuple[tuple[float, int], ...], now: float, replicas: int, span_s: float
) -> tuple[tuple[float, int], ...]:
    """The window with this recommendation added: entries older than span_s and entries no higher than the
    new one (it outlives them) are dropped, so the first entry is the window's maximum."""
    kept = tuple((t, r) for t, r in window if now - t < span_s and r > replicas)
    return (*kept, (now, replicas))
