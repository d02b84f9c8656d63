"""Spot capacity for a 24-hour RL job: a discrete-event simulation over a stored preemption trace.

No cluster, no GPU. The trace (benchmarks/traces/spot_24h.json, synthetic from published interruption rates,
see make_spot_trace.py) holds sampled 24-hour days of node interruptions per pool with the time each pool's
capacity returns. The same job runs on every day under each policy:

- all-on-demand: every tier on on-demand nodes (the baseline: no preemptions, cost ratio 1.0).
- rollout-spot: rollout pods on spot only; a preempted pod's replacement waits for the pool's capacity.
- rollout-prefer-spot: rollout pods prefer spot; a replacement falls back to on-demand at once (and stays
  there: consolidation back to spot, as Karpenter may do, is not modelled, so this overstates its cost).
- rollout+learner-spot: rollout pods and the learner gang on spot.

The job (Job, defaults below): an 8-GPU learner gang, 16 one-GPU rollout servers and 16 sandbox CPU pods
(on-demand in every policy; their cost is small). Training is rollout-bound: a step needs
trajectories_per_step trajectories, the rollout tier makes them at a rate proportional to its live pods, and
the learner needs learner_step_s per step at least. A preempted rollout pod loses only its in-flight
trajectories: they are re-submitted, and the generation already spent on them (half of it, on average) is
done again; no training step is lost. A learner preemption notice makes the learner finish its step and
write an emergency checkpoint (as the learner does on SIGTERM): within the notice no step is lost, else the
gang resumes from the last periodic checkpoint. Replacements come back after the pool's capacity returns,
node provisioning, and the server's start-up.

Reported per scenario of the trace and per policy, mean over the days (and the worst day where it matters):
fraction of GPU-hours on spot, training steps lost to preemptions (goal 0), trajectories re-submitted, wall
clock to finish the job against all-on-demand, and cost against all-on-demand for the same work.
"""

# No `from __future__ import annotations`: benchmarks/run.py loads this file as a module it does not register in
# sys.modules, and dataclasses look string annotations up there.
import heapq
import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kuberl.api.spec import Capacity

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TRACE = HERE / "traces" / "spot_24h.json"
ROLLOUT_POOL, LEARNER_POOL = "rollout-gpu-1x", "learner-gpu-8x"


@dataclass(frozen=True)
class Job:
    """The simulated job. Times other than rollout_start_s are assumptions, not measurements."""

    total_steps: int = 1380  # 23 h at 60 s a step: the job fits the 24-hour trace on on-demand
    learner_gpus: int = 8  # one 8-GPU node, on-demand unless the policy says spot
    rollout_pods: int = 16  # one GPU each
    sandbox_pods: int = 16  # CPU; client affinity pins each rollout pod to one (docs/operator.md)
    trajectories_per_step: int = 512
    in_flight_per_pod: int = 64  # rollout.concurrentSessions default
    trajectory_s: float = 120.0  # one trajectory's generation time on its server
    learner_step_s: float = 45.0  # the learner's own time per step (async: overlapped with generation)
    checkpoint_every_steps: int = 30  # checkpoint.intervalMinutes (30) at 60 s a step
    emergency_checkpoint_s: float = 90.0  # sharded model + optimizer state to object storage
    gpu_node_provision_s: float = 300.0  # a GPU node from launch to schedulable: boot, driver, image pull
    # A rollout server from pod start to serving again: 27 s measured in this project by bench_recovery
    # (kuberl run on CPU with a tiny model); a real model's weights take longer to load, so this is a floor.
    rollout_start_s: float = 27.0
    learner_start_s: float = 240.0  # image, checkpoint download, NCCL rendezvous


@dataclass(frozen=True)
class Prices:
    """Per GPU-hour, on-demand = 1. The spot ratio is an assumption: GPU spot prices commonly sit at 30-40%
    of on-demand (providers advertise up to 90-91% off), and they move; it is a parameter."""

    spot_ratio: float = 0.35
    sandbox_pod_hour: float = 0.05  # a 4-vCPU, 8 GiB pod against one GPU-hour (assumption)


@dataclass(frozen=True)
class Policy:
    name: str
    rollout: Capacity
    learner: Capacity


POLICIES = (
    Policy("all-on-demand", Capacity.ON_DEMAND, Capacity.ON_DEMAND),
    Policy("rollout-spot", Capacity.SPOT, Capacity.ON_DEMAND),
    Policy("rollout-prefer-spot", Capacity.PREFER_SPOT, Capacity.ON_DEMAND),
    Policy("rollout+learner-spot", Capacity.SPOT, Capacity.SPOT),
)


@dataclass(frozen=True)
class Interruption:
    pool: str
    slot: int
    at_s: float
    capacity_returns_s: float


@dataclass(frozen=True)
class Outcome:
    wall_clock_s: float
    steps_lost: int
    trajectories_resubmitted: int
    preemptions: int
    on_demand_gpu_h: float
    spot_gpu_h: float
    sandbox_pod_h: float

    def cost(self, prices: Prices) -> float:
        return self.on_demand_gpu_h + prices.spot_ratio * self.spot_gpu_h + prices.sandbox_pod_hour * self.sandbox_pod_h


# ------------------------------------------------------------------------------------------ the model
def trajectory_rate(live_pods: int, job: Job) -> float:
    """Trajectories per second from the live rollout servers."""
    return live_pods * job.in_flight_per_pod / job.trajectory_s


def step_rate(trajectories_per_s: float, job: Job) -> float:
    """Steps per second: the rollout tier's output or the learner's own speed, whichever is slower."""
    return min(1.0 / job.learner_step_s, trajectories_per_s / job.trajectories_per_step)


def emergency_checkpoint_fits(steps: float, seconds_per_step: float, notice_s: float, job: Job) -> bool:
    """The learner finishes the step it is in, then writes its checkpoint; both within the notice?"""
    remaining = (math.ceil(steps) - steps) * seconds_per_step
    return remaining + job.emergency_checkpoint_s <= notice_s


@dataclass
class _Node:
    """A node slot of the job: the capacity it is billed as now (None: no node) and when it serves."""

    capacity: Capacity | None
    ready_at: float = 0.0

    def live(self, t: float) -> bool:
        return self.capacity is not None and t >= self.ready_at


@dataclass
class _Run:
    """The simulation's mutable state, private to simulate()."""

    rollout: list[_Node]
    learner: _Node
    steps: float = 0.0
    checkpoint: int = 0  # the newest complete checkpoint's step
    stop_at: float | None = None  # the learner stops here after an emergency checkpoint
    redo: float = 0.0  # trajectories' worth of generation to do again before the next step
    gpu_s: dict[Capacity, float] = field(default_factory=lambda: {Capacity.ON_DEMAND: 0.0, Capacity.SPOT: 0.0})
    steps_lost: int = 0
    resubmitted: int = 0
    preemptions: int = 0


def simulate(job: Job, policy: Policy, day: list[Interruption], notice_s: float) -> Outcome:
    """Run the job through one day of interruptions under a policy; the day's trace ends, the job need not."""
    start = Capacity.ON_DEMAND if policy.rollout == Capacity.ON_DEMAND else Capacity.SPOT
    learner = Capacity.SPOT if policy.learner == Capacity.SPOT else Capacity.ON_DEMAND
    run = _Run(rollout=[_Node(start) for _ in range(job.rollout_pods)], learner=_Node(learner))
    events: list[tuple[float, int, str, int, float]] = []  # (time, order, kind, slot, capacity returns)
    for i, e in enumerate(day):
        if e.pool == ROLLOUT_POOL and policy.rollout != Capacity.ON_DEMAND:
            events.append((e.at_s, i, "preempt-rollout", e.slot, e.capacity_returns_s))
        elif e.pool == LEARNER_POOL and policy.learner == Capacity.SPOT:
            events.append((max(0.0, e.at_s - notice_s), i, "notice-learner", e.slot, e.capacity_returns_s))
            events.append((e.at_s, i, "preempt-learner", e.slot, e.capacity_returns_s))
    heapq.heapify(events)
    order, now = len(day), 0.0
    while True:
        until = events[0][0] if events else math.inf
        done = _advance(run, job, now, until)
        if done is not None:
            return _outcome(run, job, done)
        if not events:
            raise RuntimeError("the job can make no progress and nothing is left to happen")
        now, _, kind, slot, returns = heapq.heappop(events)
        for when, what, which in _handle(run, job, policy, kind, slot, now, returns, notice_s):
            order += 1
            heapq.heappush(events, (when, order, what, which, returns))


def _advance(run: _Run, job: Job, t0: float, t1: float) -> float | None:
    """Progress and billing from t0 to t1 (nothing changes state in between); the finish time if it falls in."""
    live = sum(node.live(t0) for node in run.rollout)
    produced, finish = trajectory_rate(live, job), None
    end = t1
    if run.learner.live(t0) and produced > 0:
        paid_s = min(t1 - t0, run.redo / produced)
        run.redo -= paid_s * produced
        rate = step_rate(produced, job)
        limit = min(job.total_steps, run.stop_at if run.stop_at is not None else job.total_steps)
        gain = rate * (t1 - t0 - paid_s)
        if run.steps + gain >= limit:
            if limit == job.total_steps:
                end = finish = t0 + paid_s + (limit - run.steps) / rate
            run.steps = limit
        else:
            run.steps += gain
        periodic = math.floor(run.steps / job.checkpoint_every_steps) * job.checkpoint_every_steps
        run.checkpoint = max(run.checkpoint, periodic)
    if math.isinf(end):
        return None
    for node, gpus in ((run.learner, job.learner_gpus), *((n, 1) for n in run.rollout)):
        if node.capacity is not None:
            run.gpu_s[node.capacity] += gpus * (end - t0)
    return finish


def _handle(
    run: _Run, job: Job, policy: Policy, kind: str, slot: int, now: float, returns: float, notice_s: float
) -> list[tuple[float, str, int]]:
    """Apply one event; returns the events it causes (time, kind, slot). Times when a node becomes ready
    come back as "ready" events with no effect: they only split the time so that rates stay constant."""
    if kind == "preempt-rollout":
        node = run.rollout[slot]
        if node.capacity != Capacity.SPOT:
            return []  # no spot node in that slot now (on-demand fallback, or still waiting for capacity)
        run.preemptions += 1
        if node.live(now):
            run.resubmitted += job.in_flight_per_pod
            run.redo += job.in_flight_per_pod / 2  # on average half generated when lost
        if policy.rollout == Capacity.PREFER_SPOT:
            node.capacity, node.ready_at = Capacity.ON_DEMAND, now + job.gpu_node_provision_s + job.rollout_start_s
            return [(node.ready_at, "ready", slot)]
        node.capacity, node.ready_at = None, math.inf
        return [(max(now, returns), "launch-rollout", slot)]
    if kind == "launch-rollout":
        node = run.rollout[slot]
        node.capacity, node.ready_at = Capacity.SPOT, now + job.gpu_node_provision_s + job.rollout_start_s
        return [(node.ready_at, "ready", slot)]
    if kind == "notice-learner":
        if run.learner.capacity == Capacity.SPOT and run.learner.live(now):
            rate = step_rate(trajectory_rate(sum(n.live(now) for n in run.rollout), job), job)
            if rate > 0 and emergency_checkpoint_fits(run.steps, 1.0 / rate, notice_s, job):
                run.stop_at = float(math.ceil(run.steps))
        return []
    if kind == "preempt-learner":
        if run.learner.capacity != Capacity.SPOT:
            return []
        run.preemptions += 1
        if run.stop_at is not None and run.steps >= run.stop_at:
            run.checkpoint = int(run.stop_at)  # the emergency checkpoint was written in time
        run.steps_lost += math.floor(run.steps) - run.checkpoint
        run.steps, run.stop_at = float(run.checkpoint), None
        run.learner.capacity, run.learner.ready_at = None, math.inf
        return [(max(now, returns), "launch-learner", 0)]
    if kind == "launch-learner":
        run.learner.capacity = Capacity.SPOT
        run.learner.ready_at = now + job.gpu_node_provision_s + job.learner_start_s
        return [(run.learner.ready_at, "ready", 0)]
    return []  # "ready"


def _outcome(run: _Run, job: Job, finish_s: float) -> Outcome:
    return Outcome(
        wall_clock_s=finish_s,
        steps_lost=run.steps_lost,
        trajectories_resubmitted=run.resubmitted,
        preemptions=run.preemptions,
        on_demand_gpu_h=run.gpu_s[Capacity.ON_DEMAND] / 3600.0,
        spot_gpu_h=run.gpu_s[Capacity.SPOT] / 3600.0,
        sandbox_pod_h=job.sandbox_pods * finish_s / 3600.0,
    )


# ------------------------------------------------------------------------------------------ the report
@dataclass(frozen=True)
class Scenario:
    notice_s: float
    expected_interruptions_per_day: float  # from the pools' rates
    days: list[list[Interruption]]


def load_trace(path: Path = TRACE) -> dict[str, Scenario]:
    doc = json.loads(path.read_text())
    day_s = doc["horizon_s"]
    out = {}
    for name, s in doc["scenarios"].items():
        expected = sum(
            p["nodes"] * -math.log(1 - p["interruption_probability"]) * day_s / (p["over_hours"] * 3600)
            for p in s["pools"].values()
        )
        out[name] = Scenario(s["notice_s"], expected, [[Interruption(**e) for e in day] for day in s["days"]])
    return out


def summarise(outcomes: list[Outcome], baselines: list[Outcome], prices: Prices) -> dict[str, float]:
    """One policy over the days, against all-on-demand on the same days: means, and the worst day (_max)."""
    wall = [o.wall_clock_s / b.wall_clock_s for o, b in zip(outcomes, baselines, strict=True)]
    cost = [o.cost(prices) / b.cost(prices) for o, b in zip(outcomes, baselines, strict=True)]
    spot = [o.spot_gpu_h / (o.spot_gpu_h + o.on_demand_gpu_h) for o in outcomes]
    return {
        "spot_gpu_hour_fraction": round(statistics.fmean(spot), 3),
        "preemptions_mean": round(statistics.fmean(o.preemptions for o in outcomes), 2),
        "steps_lost_mean": round(statistics.fmean(o.steps_lost for o in outcomes), 2),
        "steps_lost_max": max(o.steps_lost for o in outcomes),
        "days_with_steps_lost": sum(o.steps_lost > 0 for o in outcomes),
        "trajectories_resubmitted_mean": round(statistics.fmean(o.trajectories_resubmitted for o in outcomes), 1),
        "wall_clock_h_mean": round(statistics.fmean(o.wall_clock_s for o in outcomes) / 3600, 3),
        "wall_clock_ratio": round(statistics.fmean(wall), 4),
        "wall_clock_ratio_max": round(max(wall), 4),
        "cost_ratio": round(statistics.fmean(cost), 4),
        "cost_ratio_max": round(max(cost), 4),
    }


def check(outcomes: dict[str, list[Outcome]], summaries: dict[str, dict[str, float]]) -> None:
    """The simulator's own invariants for one scenario; a failure means the model is wrong, not a policy."""
    for policy, days in outcomes.items():
        for o in days:
            assert o.wall_clock_s > 0 and o.on_demand_gpu_h >= 0 and o.spot_gpu_h >= 0, (policy, o)
            assert o.steps_lost >= 0 and o.trajectories_resubmitted >= 0, (policy, o)
    assert all(o.preemptions == 0 and o.spot_gpu_h == 0 for o in outcomes["all-on-demand"])
    baseline = summaries["all-on-demand"]
    assert baseline["cost_ratio"] == baseline["cost_ratio_max"] == baseline["wall_clock_ratio"] == 1.0
    assert all(s["wall_clock_ratio"] >= 1.0 for s in summaries.values())  # losing pods never speeds a job up


def run(job: Job = Job(), prices: Prices = Prices()) -> dict[str, object]:
    scenarios = {}
    for name, scenario in load_trace().items():
        outcomes = {p.name: [simulate(job, p, day, scenario.notice_s) for day in scenario.days] for p in POLICIES}
        baselines = outcomes["all-on-demand"]
        summaries = {policy: summarise(days, baselines, prices) for policy, days in outcomes.items()}
        check(outcomes, summaries)
        scenarios[name] = {
            "days": len(scenario.days),
            "notice_s": scenario.notice_s,
            "interruptions_per_day": {
                "expected": round(scenario.expected_interruptions_per_day, 3),
                "sampled": round(statistics.fmean(len(day) for day in scenario.days), 3),
            },
            "policies": summaries,
        }
    on_demand_step_s = 1 / step_rate(trajectory_rate(job.rollout_pods, job), job)
    shape = {
        "total_steps": job.total_steps,
        "learner_gpus": job.learner_gpus,
        "rollout_gpus": job.rollout_pods,
        "sandbox_pods": job.sandbox_pods,
        "on_demand_step_s": round(on_demand_step_s, 1),
    }
    return {
        "trace": str(TRACE.relative_to(REPO)),
        "job": shape,
        "spot_price_ratio": prices.spot_ratio,
        "scenarios": scenarios,
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=1))
