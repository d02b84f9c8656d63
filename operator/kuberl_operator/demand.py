"""The sandbox demand the rollout tier reports: its pods' Prometheus metrics, scraped by the operator and
summed into the autoscalers' input: the default pool's (kuberl_operator.autoscale.SandboxDemand) and each
image's (kuberl_operator.pools.ImageDemand), told apart by the samples' `image` label.

Read from the rollout pods, not the sandbox pods: the sandbox NetworkPolicy does not admit the operator
(the rollout one does), and the demand that matters (episodes queued for a session) exists only on the
rollout side.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from kuberl_operator.autoscale import SandboxDemand
from kuberl_operator.meta import ROLLOUT, TIER_LABEL
from kuberl_operator.pools import ImageDemand

SCRAPE_TIMEOUT_S = 2.0
RUNNING = "kuberl_rollout_active_sessions"  # episodes running, each holding one sandbox session
QUEUED = "kuberl_rollout_queued_trajectories"  # episodes accepted and waiting to start
UPCOMING = "kuberl_rollout_upcoming_sessions"  # episodes the learner announced it will submit next
START = "kuberl_rollout_sandbox_session_start_seconds"  # histogram: seconds to open a session
WAIT = "kuberl_rollout_sandbox_wait_seconds"  # histogram: an episode's start to its session open, by image
IMAGE_LABEL = "image"
DEFAULT_IMAGE = ""
"""The `image` label of the default pool's episodes (servers that label none report only those)."""
_COUNTED = (RUNNING, QUEUED, UPCOMING, f"{START}_sum", f"{START}_count", f"{WAIT}_sum", f"{WAIT}_count")


@dataclass
class StartLatency:
    """A histogram's sum and count per series (pod, image) at the last scrape: the latency reported is the
    mean over the observations since then (the histogram itself counts since the pod started)."""

    totals: dict[Hashable, tuple[float, float]] = field(default_factory=dict)

    def mean_since_last(self, now: Mapping[Hashable, tuple[float, float]]) -> float | None:
        return self.means_since_last({key: (key, *v) for key, v in now.items()}).get(None)

    def means_since_last(self, now: Mapping[Hashable, tuple[Hashable, float, float]]) -> dict[Hashable, float]:
        """Per group: series key -> (group, sum, count); the mean since the last call of each group's series
        (None collects every series when the groups are the keys themselves, see mean_since_last)."""
        seconds: dict[Hashable, float] = defaultdict(float)
        count: dict[Hashable, float] = defaultdict(float)
        for key, (group, total, n) in now.items():
            before_total, before_n = self.totals.get(key, (0.0, 0.0))
            if n < before_n:  # a restarted pod's histogram starts again from zero
                before_total = before_n = 0.0
            for g in {group, None}:
                seconds[g] += total - before_total
                count[g] += n - before_n
        self.totals = {key: (total, n) for key, (_, total, n) in now.items()}
        return {g: seconds[g] / count[g] for g in count if count[g] > 0}


@dataclass(frozen=True)
class RolloutDemand:
    """The rollout tier's demand, summed over its pods: the default pool's and each image's."""

    default: SandboxDemand
    images: dict[str, ImageDemand]


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


def parse_rollout_metrics(text: str) -> dict[str, dict[str, float]]:
    """image -> {sample name: value} of the demand samples of one rollout server's /metrics (an unlabelled
    sample is the default pool's, image "")."""
    values: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_COUNTED, 0.0))
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in _COUNTED:
                values[sample.labels.get(IMAGE_LABEL, DEFAULT_IMAGE)][sample.name] += sample.value
    return dict(values)


def scrape_demand(pods: list[dict[str, Any]], latency: StartLatency, waits: StartLatency) -> RolloutDemand | None:
    """The rollout tier's demand, or None when no rollout pod answered (then the autoscalers hold).
    `latency` keeps the default pool's session-start histogram, `waits` each image's wait histogram."""
    urls = {pod["metadata"]["name"]: url for pod in pods if (url := metrics_url(pod))}
    if not urls:
        return None
    with ThreadPoolExecutor(max_workers=min(8, len(urls))) as pool:
        texts = dict(zip(urls, pool.map(_get, urls.values()), strict=True))
    parsed = {pod: parse_rollout_metrics(text) for pod, text in texts.items() if text is not None}
    if not parsed:
        return None
    totals: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(_COUNTED, 0.0))
    for by_image in parsed.values():
        for image, values in by_image.items():
            for name, value in values.items():
                totals[image][name] += value
    empty = dict.fromkeys(_COUNTED, 0.0)
    default = totals.get(DEFAULT_IMAGE, empty)
    starts = {
        pod: (p.get(DEFAULT_IMAGE, empty)[f"{START}_sum"], p.get(DEFAULT_IMAGE, empty)[f"{START}_count"])
        for pod, p in parsed.items()
    }
    mean = latency.mean_since_last(starts)
    waited = waits.means_since_last(
        {
            (pod, image): (image, v[f"{WAIT}_sum"], v[f"{WAIT}_count"])
            for pod, p in parsed.items()
            for image, v in p.items()
            if image != DEFAULT_IMAGE
        }
    )
    images = {
        image: ImageDemand(
            running=round(v[RUNNING]),
            queued=round(v[QUEUED]),
            upcoming=round(v[UPCOMING]),
            start_latency_s=waited.get(image),
        )
        for image, v in totals.items()
        if image != DEFAULT_IMAGE
    }
    return RolloutDemand(
        SandboxDemand(
            sessions_wanted=round(default[RUNNING] + default[QUEUED]),
            sessions_open=round(default[RUNNING]),
            start_latency_s=mean,
        ),
        images,
    )


def _get(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT_S) as response:
            return response.read().decode()
    except OSError:
        return None  # a pod that does not answer now is left out of this sum
