"""The sandbox autoscaler (kuberl_operator.autoscale): replayed on demand traces, then edge cases as a table.

The traces (tests/operator/traces/, synthetic, see make_traces.py) give the sessions the rollout tier wants
each second. The simulation calls the scaler every observation interval with the capacity it has built:
pods become ready READY_DELAY_S after they are asked for, sessions beyond the ready capacity queue, and a
queued session waits about QUEUE_WAIT_S more to start.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from kuberl_operator.autoscale import (
    Recommendation,
    SandboxDemand,
    ScaleReason,
    ScalerState,
    ScalingPolicy,
    needed_replicas,
    recommend,
)

TRACES = Path(__file__).resolve().parent / "traces"
POLICY = ScalingPolicy()
INTERVAL_S = 3  # the operator's observation interval
READY_DELAY_S = 20  # a sandbox pod from asked for to ready
QUEUE_WAIT_S = 15.0  # extra start latency of a session that waits for capacity
SESSIONS_PER_POD, MIN, MAX = 16, 1, 24
FLAP_WINDOW_S = 600


@dataclass(frozen=True)
class Step:
    """One observation of the simulation."""

    t: int
    wanted: int
    before: int  # replicas asked for before this call
    after: int  # replicas recommended
    ready: int  # pods ready at this moment
    reason: ScaleReason


def load(name: str) -> list[list[float]]:
    return json.loads((TRACES / f"{name}.json").read_text())["rows"]


def simulate(
    rows: list[list[float]],
    *,
    min_replicas: int = MIN,
    max_replicas: int = MAX,
    sessions_per_pod: int = SESSIONS_PER_POD,
    lose_state_every_s: int | None = None,
) -> list[Step]:
    """Replay a trace through the scaler; a Deployment removes pods that are not ready yet first."""
    pods: list[float] = [0.0] * min_replicas  # the time each pod is (or was) ready
    state, steps = ScalerState(), []
    for t, wanted, trace_open, base_latency in rows:
        t, wanted = int(t), int(wanted)
        if t % INTERVAL_S:
            continue
        if lose_state_every_s and t and t % lose_state_every_s == 0:
            state = ScalerState()  # the operator restarted
        ready = sum(1 for at in pods if at <= t)
        capacity = ready * sessions_per_pod
        latency = base_latency + (QUEUE_WAIT_S if wanted > capacity else 0.0)
        demand = SandboxDemand(wanted, min(int(trace_open), capacity), latency)
        rec = recommend(
            demand,
            len(pods),
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            sessions_per_pod=sessions_per_pod,
            now=float(t),
            state=state,
        )
        steps.append(Step(t, wanted, len(pods), rec.replicas, ready, rec.reason))
        state = rec.state
        pods = sorted(pods)[: rec.replicas] + [float(t + READY_DELAY_S)] * max(0, rec.replicas - len(pods))
    return steps


def direction_changes(steps: list[Step], start: int, end: int) -> int:
    directions = [s.after > s.before for s in steps if start <= s.t < end and s.after != s.before]
    return sum(1 for a, b in itertools.pairwise(directions) if a != b)


def needed(
    wanted: int, *, min_replicas: int = MIN, max_replicas: int = MAX, sessions_per_pod: int = SESSIONS_PER_POD, **_
) -> int:
    """Pods for what is wanted plus headroom, within the bounds."""
    return min(max_replicas, max(min_replicas, needed_replicas(wanted, sessions_per_pod, POLICY.headroom)))


# ---------------------------------------------------------------------------------- replayed traces
RUNS = {  # name: (trace, options of simulate)
    "bursty_async_grpo": ("bursty_async_grpo", {}),
    "ramp_then_idle": ("ramp_then_idle", {}),
    "noisy_steady": ("noisy_steady", {}),
    "bursty_async_grpo, maxReplicas 6": ("bursty_async_grpo", {"max_replicas": 6}),
    "bursty_async_grpo, minReplicas 0": ("bursty_async_grpo", {"min_replicas": 0}),
    "bursty_async_grpo, sessionsPerPod 1": ("bursty_async_grpo", {"sessions_per_pod": 1, "max_replicas": 200}),
    "ramp_then_idle, state lost every 7 min": ("ramp_then_idle", {"lose_state_every_s": 420}),
}
TRENDING = {"ramp_then_idle"}  # demand that rises for minutes: one scale-up each time it passes the headroom


@functools.cache
def replay(name: str) -> list[Step]:
    trace, options = RUNS[name]
    return simulate(load(trace), **options)


@pytest.fixture(params=list(RUNS))
def run(request) -> tuple[str, dict, list[Step]]:
    trace, options = RUNS[request.param]
    return trace, options, replay(request.param)


def test_replicas_stay_within_min_and_max(run):
    _, options, steps = run
    low, high = options.get("min_replicas", MIN), options.get("max_replicas", MAX)
    assert all(low <= s.after <= high for s in steps)


def test_every_recommendation_covers_the_demand_it_saw_in_one_step(run):
    _, options, steps = run
    short = [s for s in steps if s.after < needed(s.wanted, **options)]
    assert not short, short[:3]


def test_capacity_is_ready_one_pod_start_after_demand_rises(run):
    """What was wanted at t is served (headroom aside) by pods ready one pod start and one interval later."""
    _, options, steps = run
    high, per_pod = options.get("max_replicas", MAX), options.get("sessions_per_pod", SESSIONS_PER_POD)
    ready_at = {s.t: s.ready for s in steps}
    lag = READY_DELAY_S + INTERVAL_S
    late = [
        s for s in steps if s.t + lag in ready_at and ready_at[s.t + lag] < min(high, math.ceil(s.wanted / per_pod))
    ]
    assert not late, late[:3]


def test_scale_down_waits_for_the_window(run):
    """No scale-down within a window of a scale-up, nor below what any observation of the window needed."""
    _, options, steps = run
    window = POLICY.scale_down_window_s
    for down in (s for s in steps if s.after < s.before):
        recent = [s for s in steps if down.t - window < s.t <= down.t]
        assert not any(s.after > s.before for s in recent), f"scale-down at {down.t} s within a window of a scale-up"
        assert down.after >= max(needed(s.wanted, **options) for s in recent)


def test_no_flapping(run):
    """At most 2 changes of direction in any 10 minutes (up, then down at the end, then up again)."""
    _, _, steps = run
    worst = max(direction_changes(steps, start, start + FLAP_WINDOW_S) for start in range(0, steps[-1].t, 30))
    assert worst <= 2


@pytest.mark.parametrize("name", [name for name, (trace, _) in RUNS.items() if trace not in TRENDING])
def test_demand_without_a_trend_moves_the_pods_rarely(name):
    """Batches and jitter: at most 4 scale events in any 10 minutes. (A ramp gets a scale-up each time it
    passes the headroom, each to just what it needs: see test_a_ramp_is_met_without_overshoot.)"""
    steps = replay(name)
    events = [s.t for s in steps if s.after != s.before]
    busiest = max(sum(1 for t in events if start <= t < start + FLAP_WINDOW_S) for start in range(0, steps[-1].t, 30))
    assert busiest <= 4


def test_a_ramp_is_met_without_overshoot():
    steps = replay("ramp_then_idle")
    ups = [s for s in steps if s.after > s.before]
    assert ups and all(s.after == needed(s.wanted) for s in ups)


def test_bursty_trace_holds_its_pods_between_batches():
    """Demand falls to almost nothing between batches; the pods stay for the next batch."""
    steps = replay("bursty_async_grpo")
    gaps = [s for s in steps if s.t > 300 and s.wanted < 0.1 * max(x.wanted for x in steps)]
    assert len(gaps) > 300  # most of the time, in this trace
    assert all(s.after >= needed(max(x.wanted for x in steps)) - 2 for s in gaps)


def test_idle_tail_scales_down_to_min_after_the_window():
    steps = replay("ramp_then_idle")
    last_demand = max(s.t for s in steps if s.wanted > 0)
    first_down = min(s.t for s in steps if s.after < s.before)
    assert first_down >= last_demand  # the ramp never scaled down
    assert steps[-1].after == MIN
    at_min = min(s.t for s in steps if s.after == MIN and s.t > first_down)
    assert at_min - last_demand <= POLICY.scale_down_window_s + 5 * POLICY.scale_down_period_s


# ---------------------------------------------------------------------------------------- edge cases
def call(
    wanted: int,
    current: int,
    *,
    open_: int | None = None,
    latency: float | None = None,
    min_replicas: int = 1,
    max_replicas: int = 10,
    sessions_per_pod: int = 10,
    now: float = 1000.0,
    state: ScalerState | None = None,
) -> Recommendation:
    demand = SandboxDemand(wanted, wanted if open_ is None else open_, latency)
    return recommend(
        demand,
        current,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        sessions_per_pod=sessions_per_pod,
        now=now,
        state=state or ScalerState(),
    )


def settled(at: float, replicas: int) -> ScalerState:
    """The state of a scaler that scaled up to `replicas` at `at` and has recommended no more since."""
    return ScalerState(window=((at, replicas),), last_scale_up_s=at)


@pytest.mark.parametrize(
    ("case", "kwargs", "replicas", "reason"),
    [
        ("zero demand at min stays at min", dict(wanted=0, current=1), 1, ScaleReason.STEADY),
        ("demand above max gets max", dict(wanted=500, current=2), 10, ScaleReason.BOUNDS),
        ("a rise gets all it needs at once", dict(wanted=64, current=1), 8, ScaleReason.DEMAND),  # 64 * 1.25 / 10
        ("minReplicas 0 with nothing wanted", dict(wanted=0, current=0, min_replicas=0), 0, ScaleReason.STEADY),
        ("minReplicas 0, the first session", dict(wanted=1, current=0, min_replicas=0), 1, ScaleReason.DEMAND),
        ("sessionsPerPod 1", dict(wanted=8, current=1, sessions_per_pod=1), 10, ScaleReason.DEMAND),
        ("sessionsPerPod 1, within max", dict(wanted=4, current=1, sessions_per_pod=1), 5, ScaleReason.DEMAND),
        ("a lowered maxReplicas wins over the window", dict(wanted=90, current=12), 10, ScaleReason.BOUNDS),
        ("a raised minReplicas wins at once", dict(wanted=0, current=1, min_replicas=3), 3, ScaleReason.BOUNDS),
        ("a lost state holds the pods a window", dict(wanted=0, current=6), 6, ScaleReason.STABILISING),
        ("float noise asks for no extra pod", dict(wanted=88, current=11, max_replicas=20), 11, ScaleReason.STEADY),
    ],
)
def test_edge_cases(case, kwargs, replicas, reason):
    rec = call(**kwargs)
    assert (rec.replicas, rec.reason) == (replicas, reason), case


def test_scale_down_after_the_window_in_bounded_steps():
    """Demand gone at t=0 from 8 pods: nothing for 300 s, then at most half the pods a minute."""
    state = settled(0.0, 8)
    replicas, changes = 8, []
    for now in range(3, 900, 3):
        rec = call(0, replicas, now=float(now), state=state)
        if rec.replicas != replicas:
            changes.append((now, rec.replicas))
        replicas, state = rec.replicas, rec.state
    assert changes == [(300, 4), (360, 2), (420, 1)]


def test_the_window_steps_down_from_peak_to_peak():
    state = settled(0.0, 20)
    state = call(120, 20, now=200.0, state=state, max_replicas=30).state  # 120 sessions need 15 pods
    at_400 = call(0, 20, now=400.0, state=state, max_replicas=30)  # 20 has left the window, 15 (at 200 s) has not
    assert (at_400.replicas, at_400.reason) == (15, ScaleReason.SCALE_DOWN)
    assert call(0, 15, now=499.0, state=at_400.state, max_replicas=30).replicas == 15
    assert call(0, 15, now=500.0, state=at_400.state, max_replicas=30).replicas == 8  # at most half the pods go


def test_a_scale_down_of_less_than_the_tolerance_waits():
    """11 pods, the window needs 10: one pod is not worth a scale-down the next batch may undo."""
    state = settled(0.0, 11)
    rec = call(80, 11, now=400.0, state=state, max_replicas=20)
    assert (rec.replicas, rec.reason) == (11, ScaleReason.STABILISING)


def test_state_lost_mid_trace_delays_the_scale_down_by_one_window():
    restarted = call(0, 6, now=5000.0, state=ScalerState())
    assert call(0, 6, now=5299.0, state=restarted.state).replicas == 6
    assert call(0, 6, now=5300.0, state=restarted.state).replicas == 3


def test_state_lost_mid_trace_never_delays_a_scale_up():
    assert call(64, 2, now=5000.0, state=ScalerState()).replicas == 8


def test_slow_starts_on_saturated_pods_add_pods():
    """40 sessions wanted, 38 open on 4 pods of 10 and slow starts: the counts need 5 pods, latency adds 1."""
    rec = call(40, 4, open_=38, latency=12.0)
    assert (rec.replicas, rec.reason) == (6, ScaleReason.START_LATENCY)


def test_slow_starts_add_pods_once_per_cooldown():
    first = call(40, 4, open_=38, latency=12.0, now=1000.0)
    again = call(40, first.replicas, open_=58, latency=12.0, now=1030.0, state=first.state)
    later = call(40, first.replicas, open_=58, latency=12.0, now=1060.0, state=first.state)
    assert again.replicas == first.replicas == 6
    assert (later.replicas, later.reason) == (8, ScaleReason.START_LATENCY)


@pytest.mark.parametrize(
    ("case", "open_", "latency"),
    [("pods not saturated", 20, 12.0), ("latency not measured", 38, None), ("starts fast", 38, 1.0)],
)
def test_slow_starts_alone_add_no_pods(case, open_, latency):
    assert call(40, 5, open_=open_, latency=latency).replicas == 5, case


def test_invalid_bounds_are_refused():
    with pytest.raises(ValueError):
        call(1, 1, min_replicas=3, max_replicas=2)
    with pytest.raises(ValueError):
        call(1, 1, sessions_per_pod=0)
