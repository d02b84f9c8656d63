"""Sandbox pools per image over a simulated day of RL on SWE-bench Verified's images: pod-hours against waits.

No cluster. 500 images, one per instance, in Verified's repository mix. A seeded trace of a sync RL loop:
steps of 16 groups x 8 episodes, tasks drawn without replacement through each epoch. When a step's last
episode ends (the batch is collected) the learner announces the next step's tasks as upcoming, trains on the
batch and updates the rollout engines' weights (`train_s`), then submits the next step; the first step is
announced as it is submitted. The submit times are those of a run whose episodes never wait, the same for
every strategy. Episode durations are lognormal. A pod is ready a cold image pull plus the server's start
after it is created (PULL_S: assumptions per repository, not measurements; every start pulls, as a node's
image cache holds few of 500 multi-GB images). Four strategies on the same trace:

- kuberl: the operator's planner, `kuberl_operator.pools.plan_pools` (the real one), called every 3 s with
  each image's running, queued and upcoming episodes; a pool's pods are created and removed as it says (a
  pod that is not ready goes first, then the emptiest; an episode on a removed pod starts again).
- always-on: one pod per image, all day.
- pod-per-episode: each episode creates its own pod and deletes it when done; no warm pool.
- oracle: knows the future: each image has exactly the pods its concurrent episodes need
  (ceil(sessions / sessionsPerPod)) while they run, ready when they start, none otherwise.

Reported per strategy: pod-hours per useful episode-hour (the sum of episode durations) and an episode's wait
for its sandbox session (p50, p99). Goal: p99 wait under 10 s with under 1.5x the oracle's pod-hours.

The training step plus weight update (`train_s`, the announcement's lead) is an assumption: 90 s. A step of
128 SWE trajectories of about 16k tokens (2M tokens) on an 8B model costs about 6 x 8e9 x 2M = 1e17 FLOPs to
train plus about 0.3e17 for the old-policy log-probabilities, about 40 s on 8 H100s at 40 % of their bf16
peak; the optimizer step, the weight update (16 GB to the rollout engines) and the step's overheads bring it
to 60-90 s. Longer trajectories, fewer GPUs or a reference model make it longer: 90 s is the short end, the
hard case for the waits. 30 s and 180 s are sensitivity rows.

When to announce is a trade: earlier warms the slow pulls in time, but a warm pod waits for its episodes.
Sensitivity rows: the next step announced once a fraction f < 1 of the current step's episodes has finished
(a batch's slowest episodes run minutes after the rest, so its pods wait that long), a whole step ahead (when
the step before is submitted), not at all, and the first step announced 60 s before it is submitted. The
learner cannot do the last today: its feed is made after the model is loaded, and a rollout server answers
only once its engine is loaded, so the first submission follows the first moment an announcement could reach
one; the default is 0 s.

    .venv/bin/python benchmarks/bench_sandbox_pools.py   # writes benchmarks/measured/sandbox_pools.json and
                                                         # docs/img/sandbox-pools.png
"""

from __future__ import annotations

import heapq
import json
import math
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from kuberl_operator.pools import ImageDemand, PoolLimits, PoolsState, plan_pools

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "measured" / "sandbox_pools.json"
PLOT = REPO / "docs" / "img" / "sandbox-pools.png"

# SWE-bench Verified: instances per repository (500 in all)
VERIFIED = {
    "django": 231,
    "sympy": 75,
    "sphinx-doc": 44,
    "matplotlib": 34,
    "scikit-learn": 32,
    "astropy": 22,
    "xarray": 22,
    "pytest": 19,
    "pylint": 10,
    "requests": 8,
    "seaborn": 2,
    "flask": 1,
}
# Assumed cold pull of one instance image on one node, seconds (images of about 1-5 GB at 50-100 MB/s; the
# scientific stacks are the large ones). Each instance varies by +-15 % around its repository's value.
PULL_S = {
    "django": 35,
    "sympy": 30,
    "sphinx-doc": 40,
    "matplotlib": 90,
    "scikit-learn": 80,
    "astropy": 75,
    "xarray": 60,
    "pytest": 25,
    "pylint": 30,
    "requests": 20,
    "seaborn": 50,
    "flask": 20,
}


@dataclass(frozen=True)
class Setup:
    """The simulated job. Defaults: the RLJob's sandbox.pools defaults, sessionsPerPod's default, and a
    maxReplicas sized for the images in flight."""

    hours: float = 24.0
    repositories: dict[str, int] = field(default_factory=lambda: dict(VERIFIED))
    groups_per_step: int = 16
    group_size: int = 8
    episode_median_s: float = 120.0
    episode_sigma: float = 0.7  # lognormal spread: p90 about 2.5x, p99 about 5x the median
    episode_max_s: float = 1800.0  # sandbox.session.timeout
    server_start_s: float = 3.0
    tick_s: float = 3.0  # the operator's observation period
    train_s: float = 90.0  # from a batch collected to the next step submitted: training step + weight update
    # when the learner announces the next step's tasks (upcoming): "finished" (a fraction `announce_fraction` of
    # the current step's episodes has finished; 1.0, the learner's rule: the batch is collected), "step-ahead"
    # (the current step is submitted) or "none"
    announce: str = "finished"
    announce_fraction: float = 1.0
    first_lead_s: float = 0.0  # the first step is announced this long before it is submitted (job start-up)
    seed: int = 0
    max_replicas: int = 64
    max_warm_images: int = 64
    sessions_per_pod: int = 32
    idle_timeout_s: float = 60.0  # the RLJob's default sandbox.pools.idleTimeout (1m)
    warm_replicas: int = 1

    def limits(self) -> PoolLimits:
        return PoolLimits(
            self.max_replicas, self.max_warm_images, self.sessions_per_pod, self.idle_timeout_s, self.warm_replicas
        )


@dataclass(frozen=True)
class Trace:
    """Episodes (one row each) and steps; times in seconds."""

    pull_s: np.ndarray  # per image
    image: np.ndarray  # per episode
    submit_s: np.ndarray
    duration_s: np.ndarray
    step: np.ndarray
    step_submit_s: np.ndarray  # per step
    step_announce_s: np.ndarray
    repository: tuple[str, ...] = ()  # per image


@dataclass
class Outcome:
    pod_seconds: float
    waits: np.ndarray  # per episode: seconds from submitted to its session open (all attempts)
    end_s: float  # the last episode's end
    restarted: int = 0  # episodes whose pod was removed under them
    max_pods: int = 0
    max_images: int = 0
    capped_pod_ticks: int = 0  # sum over calls of plan.capped
    # kuberl's pod-seconds by what the image had at each call: running episodes, only queued or upcoming ones
    # (pods started ahead, pulling or waiting), none (kept warm after use)
    pod_seconds_by_use: dict[str, float] = field(default_factory=lambda: {"running": 0.0, "ahead": 0.0, "idle": 0.0})


# ------------------------------------------------------------------------------------------------ the trace
def make_trace(setup: Setup) -> Trace:
    """The seeded images and episodes of one simulated job."""
    rng = np.random.default_rng(setup.seed)
    pulls = [PULL_S[repo] * rng.uniform(0.85, 1.15, n) for repo, n in setup.repositories.items()]
    pull_s = np.concatenate(pulls)
    n_images, per_step = len(pull_s), setup.groups_per_step
    images, submits, durations, steps, step_submits = [], [], [], [], []
    order: list[int] = []
    t, k = 0.0, 0
    while t < setup.hours * 3600:
        while len(order) < per_step:  # a new epoch: every task once, in a new order
            order += list(rng.permutation(n_images))
        tasks, order = np.array(order[:per_step]), order[per_step:]
        d = np.minimum(
            setup.episode_median_s * rng.lognormal(0.0, setup.episode_sigma, per_step * setup.group_size),
            setup.episode_max_s,
        )
        images.append(np.repeat(tasks, setup.group_size))
        durations.append(d)
        submits.append(np.full(d.size, t))
        steps.append(np.full(d.size, k))
        step_submits.append(t)
        t, k = t + float(d.max()) + setup.train_s, k + 1  # collected, trained on, weights updated: the next step
    step_submit_s = np.array(step_submits)
    return Trace(
        pull_s,
        np.concatenate(images),
        np.concatenate(submits),
        np.concatenate(durations),
        np.concatenate(steps),
        step_submit_s,
        announce_times(step_submit_s, [t + d for t, d in zip(submits, durations, strict=True)], setup),
        tuple(repo for repo, n in setup.repositories.items() for _ in range(n)),
    )


def announce_times(step_submit_s: np.ndarray, ends_by_step: list[np.ndarray], setup: Setup) -> np.ndarray:
    """When the learner announces each step's tasks. The first step has no step before it: it is announced
    `first_lead_s` before it is submitted (while the learner starts)."""
    if setup.announce == "none":
        return step_submit_s
    first = step_submit_s[:1] - setup.first_lead_s
    if setup.announce == "finished":  # the ceil(f n)-th of the step before's n episodes ended
        if not 0.0 < setup.announce_fraction <= 1.0:
            raise ValueError(f"announce_fraction {setup.announce_fraction}")
        nth = [np.sort(ends)[math.ceil(setup.announce_fraction * ends.size) - 1] for ends in ends_by_step[:-1]]
        return np.concatenate([first, nth])
    if setup.announce == "step-ahead":
        return np.concatenate([first, step_submit_s[:-1]])
    raise ValueError(f"announce {setup.announce!r}")


# ------------------------------------------------------------------------------------- the simple strategies
def oracle(trace: Trace, setup: Setup) -> Outcome:
    """Exactly ceil(concurrent sessions / sessionsPerPod) pods per image while its episodes run: no wait."""
    ends = trace.submit_s + trace.duration_s
    times = np.concatenate([trace.submit_s, ends])
    delta = np.concatenate([np.ones(ends.size), -np.ones(ends.size)])
    image = np.concatenate([trace.image, trace.image])
    order = np.lexsort((delta, times, image))  # per image by time; at a tie the end first
    times, delta, image = times[order], delta[order], image[order]
    sessions = np.cumsum(delta)  # each image's deltas sum to zero, so the running sum restarts per image
    pods = np.ceil(sessions / setup.sessions_per_pod)
    same = image[1:] == image[:-1]
    pod_seconds = float(np.sum(np.diff(times)[same] * pods[:-1][same]))
    return Outcome(pod_seconds, np.zeros(ends.size), float(ends.max()))


def pod_per_episode(trace: Trace, setup: Setup) -> Outcome:
    """Each episode waits for a pod of its own (a cold pull and the server's start), deleted when it ends."""
    start = trace.pull_s[trace.image] + setup.server_start_s
    pod_seconds = float(np.sum(start + trace.duration_s))
    return Outcome(pod_seconds, start, float(np.max(trace.submit_s + start + trace.duration_s)))


def always_on(trace: Trace, setup: Setup) -> Outcome:
    """One ready pod per image all day; an episode beyond its sessionsPerPod waits for a session to end."""
    waits = np.zeros(trace.image.size)
    busy: dict[int, list[float]] = {}  # image -> end times of its open sessions (a heap)
    end_s = 0.0
    for e in np.argsort(trace.submit_s, kind="stable"):
        sessions = busy.setdefault(int(trace.image[e]), [])
        t = float(trace.submit_s[e])
        while sessions and sessions[0] <= t:
            heapq.heappop(sessions)
        start = t if len(sessions) < setup.sessions_per_pod else heapq.heappop(sessions)
        waits[e] = start - t
        heapq.heappush(sessions, start + float(trace.duration_s[e]))
        end_s = max(end_s, start + float(trace.duration_s[e]))
    return Outcome(trace.pull_s.size * end_s, waits, end_s)


# ------------------------------------------------------------------------------------ kuberl's pools
END, READY, ANNOUNCE, SUBMIT = 0, 1, 2, 3  # at one instant: sessions end, pods become ready, then demand


@dataclass(eq=False)
class _Pod:
    created: float
    ready_at: float
    episodes: set[int] = field(default_factory=set)
    removed: bool = False


class _PoolsRun:
    """The rollout tier and the pools' Deployments, driven by events between the planner's calls."""

    def __init__(self, trace: Trace, setup: Setup) -> None:
        self.trace, self.setup, self.limits = trace, setup, setup.limits()
        self.names = [f"image-{i:03d}" for i in range(trace.pull_s.size)]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.pods: dict[int, list[_Pod]] = {}
        self.queue: dict[int, deque[int]] = {}
        self.running: dict[int, int] = {}
        self.upcoming: dict[int, int] = {}
        self.active: set[int] = set()  # images with episodes or pods
        self.started: dict[int, list[float]] = {}  # waits of the sessions opened since the last call
        n = trace.image.size
        self.waits, self.queued_at = np.zeros(n), np.zeros(n)
        self.attempt = np.zeros(n, dtype=np.int64)
        self.on_pod: dict[int, _Pod] = {}
        self.state, self.done, self.seq = PoolsState(), 0, 0
        self.outcome = Outcome(0.0, self.waits, 0.0)
        self.events: list[tuple[float, int, int, int, object]] = []
        by_step = np.split(np.argsort(trace.step, kind="stable"), np.cumsum(np.bincount(trace.step))[:-1])
        for k, episodes in enumerate(by_step):
            self.push(float(trace.step_announce_s[k]), ANNOUNCE, episodes)
            self.push(float(trace.step_submit_s[k]), SUBMIT, episodes)

    def push(self, t: float, kind: int, payload: object) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, kind, self.seq, kind, payload))

    def run(self) -> Outcome:
        t = min(0.0, float(self.trace.step_announce_s.min()))  # the first step may be announced before 0
        give_up = float(self.trace.step_submit_s[-1]) + 2 * self.setup.episode_max_s + 3600.0
        while self.done < self.trace.image.size:
            if t > give_up:
                raise RuntimeError(f"{self.trace.image.size - self.done} episodes never got a session")
            while self.events and self.events[0][0] <= t:
                when, _, _, kind, payload = heapq.heappop(self.events)
                self.handle(when, kind, payload)
            self.plan(t)
            t += self.setup.tick_s
        end = self.outcome.end_s
        self.outcome.pod_seconds += sum(end - p.created for pods in self.pods.values() for p in pods)
        return self.outcome

    def handle(self, t: float, kind: int, payload) -> None:
        image = self.trace.image
        if kind == ANNOUNCE:
            for e in payload:
                self.upcoming[image[e]] = self.upcoming.get(image[e], 0) + 1
                self.active.add(int(image[e]))
        elif kind == SUBMIT:
            for e in payload:
                self.upcoming[image[e]] -= 1
                self.queue.setdefault(int(image[e]), deque()).append(int(e))
                self.queued_at[e] = t
            for i in sorted({int(image[e]) for e in payload}):
                self.place(i, t)
        elif kind == READY:
            self.place(payload, t)
        else:
            e, attempt = payload
            if attempt != self.attempt[e]:
                return  # its pod was removed and the episode started again
            self.on_pod.pop(e).episodes.discard(e)
            self.running[image[e]] -= 1
            self.done += 1
            self.outcome.end_s = max(self.outcome.end_s, t)
            self.place(int(image[e]), t)

    def place(self, i: int, now: float) -> None:
        """Queued episodes of image i onto its ready pods, the fullest pod with room first (so that the
        emptiest pods are the ones a scale-down removes)."""
        queue, per_pod = self.queue.get(i), self.setup.sessions_per_pod
        if not queue:
            return
        room = [p for p in self.pods.get(i, ()) if p.ready_at <= now and len(p.episodes) < per_pod]
        while queue and room:
            pod = max(room, key=lambda p: len(p.episodes))
            e = queue.popleft()
            self.waits[e] += now - self.queued_at[e]
            self.started.setdefault(i, []).append(now - self.queued_at[e])
            pod.episodes.add(e)
            self.on_pod[e] = pod
            self.running[i] = self.running.get(i, 0) + 1
            self.push(now + float(self.trace.duration_s[e]), END, (e, int(self.attempt[e])))
            if len(pod.episodes) >= per_pod:
                room.remove(pod)

    def plan(self, now: float) -> None:
        """One call of the real planner, applied to the pools."""
        demand, current = {}, {}
        for i in sorted(self.active):
            running, queued, upcoming = self.running.get(i, 0), len(self.queue.get(i, ())), self.upcoming.get(i, 0)
            pods = len(self.pods.get(i, ()))
            if not (running or queued or upcoming or pods):
                self.active.discard(i)
                continue
            started = self.started.pop(i, None)
            latency = sum(started) / len(started) if started else None
            if running or queued or upcoming:
                demand[self.names[i]] = ImageDemand(running, queued, upcoming, latency)
            if pods:
                current[self.names[i]] = pods
        plan = plan_pools(demand, current, self.limits, now, self.state)
        self.state = plan.state
        self.outcome.capped_pod_ticks += plan.capped
        for name in sorted(set(current) | set(plan.replicas)):
            self.scale(self.index[name], plan.replicas.get(name, 0), now)
        self.outcome.max_pods = max(self.outcome.max_pods, sum(plan.replicas.values()))
        self.outcome.max_images = max(self.outcome.max_images, len(plan.replicas))
        for name, pods in plan.replicas.items():
            d = demand.get(name)
            use = "idle" if d is None else "running" if d.running else "ahead"
            self.outcome.pod_seconds_by_use[use] += pods * self.setup.tick_s

    def scale(self, i: int, replicas: int, now: float) -> None:
        """The Deployment of image i to `replicas` pods: new pods pull the image; a scale-down removes the pods
        that are not ready, then the emptiest (a pod-deletion cost); their episodes start again."""
        pods = self.pods.setdefault(i, [])
        self.active.add(i)
        ready_at = now + float(self.trace.pull_s[i]) + self.setup.server_start_s
        for _ in range(replicas - len(pods)):
            pods.append(_Pod(now, ready_at))
            self.push(ready_at, READY, i)
        if replicas >= len(pods):
            return
        pods.sort(key=lambda p: (p.ready_at > now, -len(p.episodes), p.created))
        for pod in pods[replicas:]:
            self.outcome.pod_seconds += now - pod.created
            for e in sorted(pod.episodes):
                self.attempt[e] += 1
                self.running[i] -= 1
                self.on_pod.pop(e)
                self.queue.setdefault(i, deque()).appendleft(e)
                self.queued_at[e] = now
                self.outcome.restarted += 1
        del pods[replicas:]
        self.place(i, now)


def kuberl(trace: Trace, setup: Setup) -> Outcome:
    """The operator's pools (plan_pools every tick_s)."""
    return _PoolsRun(trace, setup).run()


STRATEGIES = {"kuberl": kuberl, "always-on": always_on, "pod-per-episode": pod_per_episode, "oracle": oracle}


# -------------------------------------------------------------------------------------------- the report
def summarise(outcome: Outcome, trace: Trace) -> dict[str, float]:
    useful = float(trace.duration_s.sum())
    return {
        "pod_hours": round(outcome.pod_seconds / 3600, 1),
        "pod_hours_per_episode_hour": round(outcome.pod_seconds / useful, 3),
        "wait_p50_s": round(float(np.percentile(outcome.waits, 50)), 2),
        "wait_p99_s": round(float(np.percentile(outcome.waits, 99)), 2),
        # the first step is announced as it is submitted (no batch before it): its episodes wait for the pulls
        "wait_p99_s_after_the_first_step": round(float(np.percentile(outcome.waits[trace.step > 0], 99)), 2),
        "wait_max_s": round(float(outcome.waits.max()), 2),
        "episodes_waiting_over_10_s": int(np.sum(outcome.waits > 10.0)),
        "episodes_waiting_over_10_s_by_repository": waiting_by_repository(outcome, trace),
        "episodes_restarted": outcome.restarted,
        "max_pods": outcome.max_pods,
        "max_images_with_pods": outcome.max_images,
        "capped_pod_observations": outcome.capped_pod_ticks,
        "pod_hours_by_use": {k: round(v / 3600, 1) for k, v in outcome.pod_seconds_by_use.items() if v},
    }


def waiting_by_repository(outcome: Outcome, trace: Trace, over_s: float = 10.0) -> dict[str, int]:
    """Episodes that waited over `over_s` per repository of their image (first step included), where any did."""
    repos = np.array(trace.repository)[trace.image[outcome.waits > over_s]]
    names, counts = np.unique(repos, return_counts=True)
    return {str(name): int(count) for name, count in zip(names, counts, strict=True)}


def compare(setup: Setup) -> dict[str, object]:
    """Every strategy on the same trace, each against the oracle."""
    trace = make_trace(setup)
    outcomes = {name: strategy(trace, setup) for name, strategy in STRATEGIES.items()}
    results = {name: summarise(outcome, trace) for name, outcome in outcomes.items()}
    best = results["oracle"]["pod_hours"]
    for summary in results.values():
        summary["pod_hours_vs_oracle"] = round(summary["pod_hours"] / best, 3) if best else None
    return {
        "episodes": int(trace.image.size),
        "steps": int(trace.step_submit_s.size),
        "useful_episode_hours": round(float(trace.duration_s.sum()) / 3600, 1),
        "strategies": results,
    }


# kuberl only, each against the oracle of its own trace: the learner's announcement and training step (a
# longer step is a longer trace, so fewer steps in the day), and the planner's idle timeout.
VARIANTS = {
    "kuberl, training step + weight update 30 s": {"train_s": 30.0},
    "kuberl, training step + weight update 180 s": {"train_s": 180.0},
    "kuberl, next step announced at 50 % of the episodes finished": {"announce_fraction": 0.5},
    "kuberl, next step announced at 75 % of the episodes finished": {"announce_fraction": 0.75},
    "kuberl, next step announced at 90 % of the episodes finished": {"announce_fraction": 0.9},
    "kuberl, next step announced at 99 % of the episodes finished": {"announce_fraction": 0.99},
    "kuberl, next step announced a whole step ahead": {"announce": "step-ahead"},  # as the step before is submitted
    "kuberl, nothing announced": {"announce": "none"},
    "kuberl, first step announced 60 s before it is submitted": {"first_lead_s": 60.0},
    "kuberl, idleTimeout 0s": {"idle_timeout_s": 0.0},
    "kuberl, idleTimeout 10m": {"idle_timeout_s": 600.0},
}
GOAL_P99_WAIT_S, GOAL_VS_ORACLE = 10.0, 1.5


def run(setup: Setup = Setup(), variants: dict[str, dict] = VARIANTS) -> dict[str, object]:
    """The four strategies on one trace, then kuberl's variants, each on its own trace against its oracle."""
    result = compare(setup)
    strategies = result["strategies"]
    for name, changes in variants.items():
        varied = replace(setup, **changes)
        trace = make_trace(varied)
        summary = summarise(kuberl(trace, varied), trace)
        best = oracle(trace, varied).pod_seconds / 3600
        summary["pod_hours_vs_oracle"] = round(summary["pod_hours"] / best, 3)
        strategies[name] = {"changes": changes, "episodes": int(trace.image.size), **summary}
    ours = strategies["kuberl"]
    return {
        "setup": {**asdict(setup), "pull_s_by_repository": PULL_S},
        "assumptions": ASSUMPTIONS,
        "goal": f"p99 wait < {GOAL_P99_WAIT_S:g} s and pod-hours < {GOAL_VS_ORACLE:g}x the oracle's",
        **result,
        "goal_met": ours["wait_p99_s"] < GOAL_P99_WAIT_S and ours["pod_hours_vs_oracle"] < GOAL_VS_ORACLE,
    }


ASSUMPTIONS = {
    "learner": "sync: the next step's tasks are announced when the current batch is collected (its last episode "
    "ends) and submitted train_s later; the first step is announced as it is submitted (the learner's feed is "
    "made after its model is loaded, and a rollout server answers once its engine is: no earlier moment); "
    "announcing at a fraction f < 1 of the episodes finished, or the first step 60 s ahead, as sensitivity rows",
    "train_s": "90 s for the training step + weight update of 128 trajectories of ~16k tokens on an 8B model on "
    "8 H100s (~1.3e17 FLOPs, ~40 s at 40 % of bf16 peak, plus optimizer, 16 GB weight update, overheads): the "
    "short end, the hard case for the waits; 30 s and 180 s as sensitivity rows",
    "submit_times": "those of a run whose episodes never wait, the same for every strategy",
    "pulls": "every pod start pulls its image cold (pull_s_by_repository, +-15 % per instance; not measured)",
    "max_replicas": "64 (the spec's default is 8): sized for the 16 images of a step and the 16 announced",
    "not_modelled": "async mode (the next groups already queued on the rollout tier), node image caches, "
    "pod scheduling and node scale-up time",
}


def plot(result: dict, path: Path = PLOT) -> None:
    """Pod-hours against the oracle's and the p99 (and p50) wait, one bar per strategy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(result["strategies"].items())[::-1]
    names = [name for name, _ in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 0.45 * len(rows) + 2.4), sharey=True)
    ratios = [r["pod_hours_vs_oracle"] for _, r in rows]
    left.barh(names, ratios, color="tab:blue")
    for y, ratio in enumerate(ratios):
        left.text(ratio * 1.05, y, f"{ratio:.2f}x", va="center", fontsize=8)
    left.axvline(GOAL_VS_ORACLE, color="tab:red", linestyle="--", label=f"goal: under {GOAL_VS_ORACLE:g}x")
    left.set_xscale("log")
    left.set_xlim(0.8, max(ratios) * 3)
    left.set_xlabel("pod-hours / the oracle's (log)")
    p99 = [r["wait_p99_s"] for _, r in rows]
    right.barh(names, [max(w, 0.1) for w in p99], color="tab:orange", label="p99")
    right.scatter([max(r["wait_p50_s"], 0.1) for _, r in rows], names, color="black", zorder=3, label="p50")
    for y, wait in enumerate(p99):
        right.text(max(wait, 0.1) * 1.8, y, f"p99 {wait:.0f} s", va="center", fontsize=8)
    right.axvline(GOAL_P99_WAIT_S, color="tab:red", linestyle="--", label=f"goal: p99 under {GOAL_P99_WAIT_S:g} s")
    right.set_xscale("log")
    right.set_xlim(0.08, 2000)
    right.set_xlabel("an episode's wait for its sandbox session, s (log; 0 drawn at 0.1)")
    for ax in (left, right):
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8, frameon=False)
    setup = result["setup"]
    fig.suptitle(
        f"Sandbox pools per image, simulated: {setup['hours']:g} h of RL, {result['episodes']} episodes on "
        f"SWE-bench Verified's 500 images\nsync learner: next step announced as the batch is collected, submitted "
        f"{setup['train_s']:g} s later (training step + weight update); idleTimeout {setup['idle_timeout_s']:g} s, "
        f"warmReplicas {setup['warm_replicas']}, sessionsPerPod {setup['sessions_per_pod']}; "
        f"commit {result['commit'][:7]}",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    sys.path.insert(0, str(HERE))
    from run import commit, machine

    started = time.perf_counter()
    measured = run()
    result = {
        "what": "sandbox pools per image, simulated (benchmarks/bench_sandbox_pools.py); no cluster",
        "commit": commit(),
        "machine": machine(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        **measured,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    plot(result)
    print(json.dumps(result["strategies"], indent=1))
    print(f"wrote {OUT.relative_to(REPO)} and {PLOT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
