"""Job-level Prometheus metrics, read from RLJob statuses: the operator exports them for every job it
drives, `kuberl run` for its one job. The names are in docs/metrics.md (section "Job").

Every series carries `namespace` and `rljob` (not `job`: Prometheus keeps that label for the scrape job).
Counts the status holds cumulatively (restarts, preemptions, GPU time) are exported as counters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Phase, Reason, RLJobStatus
from kuberl.api.types import parse_duration

TIERS = ("learner", "rollout", "sandbox")
# Reasons that name a circuit breaker (kuberl.api.status.Reason): a job ending with one "tripped" it.
BREAKER_REASONS = frozenset(
    {
        Reason.MAX_STEPS_REACHED,
        Reason.MAX_WALL_CLOCK_REACHED,
        Reason.GPU_HOUR_BUDGET_EXHAUSTED,
        Reason.NON_FINITE_LOSS,
        Reason.NO_PROGRESS,
        Reason.MISMATCH_KL_EXCEEDED,
        Reason.NO_LEARNING_SIGNAL,
        Reason.RETRY_BUDGET_EXHAUSTED,
    }
)
_LABELS = ["namespace", "rljob"]


class JobMetrics(Collector):
    """The latest status of each job, rendered as metric families on every scrape."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self._statuses: dict[tuple[str, str], RLJobStatus] = {}
        self._specs: dict[tuple[str, str], RLJobSpec] = {}
        self._lock = threading.Lock()
        if registry is not None:
            registry.register(self)

    def observe(self, namespace: str, job: str, status: RLJobStatus, spec: RLJobSpec | None = None) -> None:
        """The job's latest status, and its spec when known (the alerts' thresholds come from it)."""
        with self._lock:
            self._statuses[namespace, job] = status
            if spec is not None:
                self._specs[namespace, job] = spec

    def forget(self, namespace: str, job: str) -> None:
        with self._lock:
            self._statuses.pop((namespace, job), None)
            self._specs.pop((namespace, job), None)

    def describe(self) -> list[Metric]:
        return list(self._families({}, {}))

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            statuses, specs = dict(self._statuses), dict(self._specs)
        yield from self._families(statuses, specs)

    @staticmethod
    def _families(
        statuses: dict[tuple[str, str], RLJobStatus], specs: dict[tuple[str, str], RLJobSpec]
    ) -> Iterator[Metric]:
        families = _new_families()
        for (namespace, job), status in sorted(statuses.items()):
            _add_job(families, [namespace, job], status, specs.get((namespace, job)))
        yield from families.values()


def _new_families() -> dict[str, GaugeMetricFamily | CounterMetricFamily]:
    """Every job-level family, empty, in the order /metrics shows them."""

    def gauge(name: str, doc: str, extra: list[str] | None = None) -> GaugeMetricFamily:
        return GaugeMetricFamily(f"kuberl_job_{name}", doc, labels=[*_LABELS, *(extra or [])])

    def counter(name: str, doc: str, extra: list[str] | None = None) -> CounterMetricFamily:
        return CounterMetricFamily(f"kuberl_job_{name}", doc, labels=[*_LABELS, *(extra or [])])

    return {
        "phase": gauge("phase", "1 for the job's current phase, 0 for the others.", ["phase"]),
        "step": gauge("step", "Training steps completed."),
        "version": gauge("policy_version", "Version of the newest published policy weights."),
        "reward": gauge("reward_mean", "Mean trajectory reward of the last step."),
        "tokens": gauge("tokens_per_second", "Generated tokens per second across the rollout tier."),
        "staleness": gauge("staleness_versions", "Mean policy-version lag of the trajectories in the last batch."),
        "running": gauge(
            "running_seconds", "Seconds the job has run, time suspended excluded (the wall-clock breaker)."
        ),
        "ready": gauge("ready_workers", "Ready pods per tier.", ["tier"]),
        "sandbox_desired": gauge("sandbox_desired_replicas", "Sandbox pods the autoscaler asks for now."),
        "checkpoint_step": gauge("checkpoint_last_step", "Step of the newest complete checkpoint."),
        "checkpoint_time": gauge("checkpoint_last_timestamp_seconds", "Unix time of the newest complete checkpoint."),
        "interval": gauge(
            "checkpoint_interval_seconds", "The job's checkpoint interval in time (checkpoint.intervalMinutes)."
        ),
        "no_progress": gauge(
            "no_progress_timeout_seconds", "The job's no-progress breaker (limits.noProgressTimeout)."
        ),
        "gpu": counter(
            "gpu_seconds", "GPU-seconds used, per tier and capacity type (spot, on-demand).", ["tier", "capacity"]
        ),
        "restarts": counter(
            "restarts", "Worker restarts per tier (failures; preemptions are counted apart).", ["tier"]
        ),
        "preemptions": counter("preemptions", "Spot preemptions survived (they never spend the retry budget)."),
        "trips": counter("breaker_trips", "1 once a circuit breaker has stopped the job, by the breaker.", ["reason"]),
    }


def _add_job(f: dict, ids: list[str], status: RLJobStatus, spec: RLJobSpec | None) -> None:
    """One job's samples into the families `f` (_new_families)."""
    for p in Phase:
        f["phase"].add_metric([*ids, p.value], 1.0 if status.phase == p else 0.0)
    f["step"].add_metric(ids, status.step)
    f["version"].add_metric(ids, status.policy_version)
    for key, value in (
        ("reward", status.reward_mean),
        ("tokens", status.tokens_per_second),
        ("staleness", status.staleness),
        ("sandbox_desired", status.sandbox_replicas),
    ):
        if value is not None:
            f[key].add_metric(ids, value)
    f["running"].add_metric(ids, status.running_seconds)
    if status.last_checkpoint is not None:
        f["checkpoint_step"].add_metric(ids, status.last_checkpoint.step)
        if status.last_checkpoint.time is not None:
            f["checkpoint_time"].add_metric(ids, status.last_checkpoint.time.timestamp())
    for tier in TIERS:
        f["ready"].add_metric([*ids, tier], getattr(status.ready_workers, tier))
        f["restarts"].add_metric([*ids, tier], getattr(status.restarts, tier))
        total = getattr(status.gpu_hours_by_tier, tier) * 3600.0
        spot = min(total, getattr(status.spot_gpu_hours_by_tier, tier) * 3600.0)
        f["gpu"].add_metric([*ids, tier, "spot"], spot)
        f["gpu"].add_metric([*ids, tier, "on-demand"], total - spot)
    f["preemptions"].add_metric(ids, status.preemptions)
    if spec is not None:
        f["interval"].add_metric(ids, spec.checkpoint.interval_minutes * 60.0)
        f["no_progress"].add_metric(ids, parse_duration(spec.limits.no_progress_timeout))
    if status.reason in BREAKER_REASONS:
        f["trips"].add_metric([*ids, str(status.reason)], 1.0)
