"""The operator's own Prometheus metrics (names in docs/metrics.md, section "Operator") and the job-level
metrics of every job it drives (kuberl.job_metrics), served on `kuberl operator --metrics-port`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, start_http_server

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
