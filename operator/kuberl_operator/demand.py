"""The sandbox demand the rollout tier reports: its pods' Prometheus metrics, scraped by the operator and
summed into the autoscaler's input (kuberl_operator.autoscale.SandboxDemand).

Read from the rollout pods, not the sandbox pods: the sandbox NetworkPolicy does not admit the operator
(the rollout one does), and the demand that matters (episodes queued for a session) exists only on the
rollout side.
"""

from __future__ import annotations

import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kuberl_operator.autoscale import SandboxDemand
from kuberl_operator.meta import ROLLOUT, TIER_LABEL

SCRAPE_TIMEOUT_S = 2.0
RUNNING = "kuberl_rollout_active_sessions"  # episodes running, each holding one sandbox session
QUEUED = "kuberl_rollout_queued_trajectories"  # episodes accepted and waiting to start
START = "kuberl_rollout_sandbox_session_start_seconds"  # histogram: seconds to open a session


@dataclass
class StartLatency:
    """The session-start histogram's sum and count per pod at the last scrape: the latency reported is the
    mean over the starts since then (the histogram itself counts since the pod started)."""

    totals: dict[str, tuple[float, float]] = field(default_factory=dict)

    def mean_since_last(self, now: dict[str, tuple[float, float]]) -> float | None:
        seconds = count = 0.0
        for pod, (total, n) in now.items():
            before_total, before_n = self.totals.get(pod, (0.0, 0.0))
            if n >= before_n:  # a restarted pod's histogram starts again from zero
                seconds, count = seconds + total - before_total, count + n - before_n
            else:
                seconds, count = seconds + total, count + n
        self.totals = dict(now)
        return seconds / count if count > 0 else None


def metrics_url(pod: dict[str, Any]) -> str | None:
    """A ready rollout pod's /metrics URL (its IP and the container port named http), else None."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if labels.get(TIER_LABEL) != ROLLOUT or not ready or not status.get("podIP"):
        return None
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return f"http://{status['podIP']}:{port['containerPort']}/metrics"
    return None


def parse_rollout_metrics(text: str) -> tuple[float, float, float, float]:
    """(running, queued, start-seconds sum, start count) from one rollout server's /metrics."""
    values = {RUNNING: 0.0, QUEUED: 0.0, f"{START}_sum": 0.0, f"{START}_count": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values[RUNNING], values[QUEUED], values[f"{START}_sum"], values[f"{START}_count"]


def scrape_demand(pods: list[dict[str, Any]], latency: StartLatency) -> SandboxDemand | None:
    """The rollout tier's demand, or None when no rollout pod answered (then the autoscaler holds)."""
    urls = {pod["metadata"]["name"]: url for pod in pods if (url := metrics_url(pod))}
    if not urls:
        return None
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        texts = dict(zip(urls, pool.map(_get, urls.values()), strict=True))
    parsed = {pod: parse_rollout_metrics(text) for pod, text in texts.items() if text is not None}
    if not parsed:
        return None
    running = sum(p[0] for p in parsed.values())
    queued = sum(p[1] for p in parsed.values())
    mean = latency.mean_since_last({pod: (p[2], p[3]) for pod, p in parsed.items()})
    return SandboxDemand(sessions_wanted=round(running + queued), sessions_open=round(running), start_latency_s=mean)


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            return response.read().decode()
    except OSError:
        return None  # a pod that does not answer now is left out of this sum
