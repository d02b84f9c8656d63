"""The operator's own Prometheus metrics (names in docs/metrics.md, section "Operator") and the job-level
metrics of every job it drives (kuberl.job_metrics), served on `kuberl operator --metrics-port`."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from kuberl.api.status import SandboxPoolStatus
from kuberl.job_metrics import JobMetrics

disable_created_metrics()
HANDLERS = ("create", "apply", "observe", "delete")

registry = CollectorRegistry(auto_describe=True)
jobs = JobMetrics(registry)
reconcile_seconds = Histogram(
    "kuberl_operator_reconcile_duration_seconds",
    "Seconds one handler run took, by handler.",
    ["handler"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    registry=registry,
)
reconcile_errors = Counter(
    "kuberl_operator_reconcile_errors_total",
    "Handler runs that raised (kopf retries them), by handler.",
    ["handler"],
    registry=registry,
)
for _handler in HANDLERS:
    reconcile_seconds.labels(_handler)
    reconcile_errors.labels(_handler)


@contextmanager
def timed(handler: str) -> Iterator[None]:
    """Count a handler run's duration, and its exception if it raises (re-raised for kopf to retry)."""
    start = time.perf_counter()
    try:
        yield
    except Exception:
        reconcile_errors.labels(handler).inc()
        raise
    finally:
        reconcile_seconds.labels(handler).observe(time.perf_counter() - start)


def serve(port: int, address: str = "0.0.0.0") -> None:
    start_http_server(port, address, registry=registry)


# The sandbox pools per image of every job it drives (docs/sandbox-pools.md). Like the job metrics they carry the
# job's `namespace` and `rljob`; a pool's series go when the pool leaves the job's status.
_POOL_LABELS = ["namespace", "rljob", "pool", "image"]
pool_replicas = Gauge(
    "kuberl_operator_sandbox_pool_replicas",
    "Pods the planner asks for, per image pool.",
    _POOL_LABELS,
    registry=registry,
)
pool_ready_pods = Gauge(
    "kuberl_operator_sandbox_pool_ready_pods", "Ready pods per image pool.", _POOL_LABELS, registry=registry
)
unusable_images = Gauge(
    "kuberl_operator_sandbox_unusable_images",
    "Images whose pods cannot run (pull failures, crash loops, no shell): their instances are left out.",
    ["namespace", "rljob"],
    registry=registry,
)
capped_pods = Gauge(
    "kuberl_operator_sandbox_pool_capped_pods",
    "Pods the image pools wanted that maxReplicas or maxWarmImages denied at the last plan.",
    ["namespace", "rljob"],
    registry=registry,
)
image_failures = Counter(
    "kuberl_operator_sandbox_image_failures",
    "Images found unusable, by reason (ErrImagePull, ImagePullBackOff, InvalidImageName, CrashLoopBackOff, "
    "ServerCannotStart).",
    ["namespace", "rljob", "reason"],
    registry=registry,
)


class PoolMetrics:
    """Writes the pool series of each job and removes those of pools (and jobs) that are gone."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], set[tuple[str, str]]] = {}
        self._reasons: dict[tuple[str, str], set[str]] = {}
        self._lock = threading.Lock()

    def observe(self, namespace: str, job: str, statuses: Iterable[SandboxPoolStatus], capped: int) -> None:
        statuses = list(statuses)
        with self._lock:
            now = {(s.pool, s.image) for s in statuses}
            for pool, image in self._series.get((namespace, job), set()) - now:
                pool_replicas.remove(namespace, job, pool, image)
                pool_ready_pods.remove(namespace, job, pool, image)
            self._series[namespace, job] = now
            for s in statuses:
                pool_replicas.labels(namespace, job, s.pool, s.image).set(s.replicas)
                pool_ready_pods.labels(namespace, job, s.pool, s.image).set(s.ready)
            unusable_images.labels(namespace, job).set(sum(1 for s in statuses if s.unusable))
            capped_pods.labels(namespace, job).set(capped)

    def image_failed(self, namespace: str, job: str, reason: str) -> None:
        with self._lock:
            self._reasons.setdefault((namespace, job), set()).add(reason)
            image_failures.labels(namespace, job, reason).inc()

    def forget(self, namespace: str, job: str) -> None:
        """A deleted job's series go."""
        with self._lock:
            for pool, image in self._series.pop((namespace, job), set()):
                pool_replicas.remove(namespace, job, pool, image)
                pool_ready_pods.remove(namespace, job, pool, image)
            for reason in self._reasons.pop((namespace, job), set()):
                image_failures.remove(namespace, job, reason)
            for gauge in (unusable_images, capped_pods):
                with contextlib.suppress(KeyError):
                    gauge.remove(namespace, job)


pools = PoolMetrics()
