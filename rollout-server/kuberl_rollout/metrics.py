"""Prometheus metrics of a rollout server (names and units in docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from kuberl.api.trajectory import FinishReason

disable_created_metrics()
DEFAULT_IMAGE = ""
"""The `image` label of episodes on the job's default sandbox servers."""
_TURN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RolloutMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._episode_metrics()
        self._engine_metrics()
        self._session_metrics()
        self._weight_metrics()

    def _episode_metrics(self) -> None:
        """Episodes: tokens, sessions by image, the waits and turns, finished trajectories."""
        r = self.registry
        self.generated_tokens = Counter("kuberl_rollout_generated_tokens_total", "Tokens sampled.", registry=r)
        self.active_sessions = ImageGauge(
            Gauge("kuberl_rollout_active_sessions", "Episodes running now, by sandbox image.", ["image"], registry=r)
        )
        self.queued = ImageGauge(
            Gauge(
                "kuberl_rollout_queued_trajectories",
                "Episodes accepted, not yet started, by sandbox image.",
                ["image"],
                registry=r,
            )
        )
        self.upcoming = ImageGauge(
            Gauge(
                "kuberl_rollout_upcoming_sessions",
                "Episodes the learner announced it will submit next, not yet submitted, by sandbox image.",
                ["image"],
                registry=r,
            )
        )
        self.sandbox_wait_seconds = Histogram(
            "kuberl_rollout_sandbox_wait_seconds",
            "Seconds from an episode's start to its sandbox session open (an image's pool warming up included).",
            ["image"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1200),
            registry=r,
        )
        self.sandbox_wait_seconds.labels(DEFAULT_IMAGE)
        self.turn_seconds = Histogram(
            "kuberl_rollout_turn_seconds",
            "Seconds of one turn, by phase.",
            ["phase"],
            buckets=_TURN_BUCKETS,
            registry=r,
        )
        self.trajectories = Counter(
            "kuberl_rollout_trajectories_total", "Finished trajectories by finish reason.", ["reason"], registry=r
        )
        for reason in (*FinishReason, "cancelled"):  # from the start at 0: failure rates are 0, not absent
            self.trajectories.labels(str(reason))

    def _engine_metrics(self) -> None:
        """The vLLM engine's KV cache and queue."""
        r = self.registry
        self.kv_cache_usage = Gauge(
            "kuberl_rollout_kv_cache_usage_ratio", "Fraction of vLLM's KV cache in use.", registry=r
        )
        self.engine_waiting = Gauge(
            "kuberl_rollout_engine_waiting_requests", "Requests waiting in vLLM's scheduler.", registry=r
        )

    def _session_metrics(self) -> None:
        """Sandbox session starts, and the OpenAI-compatible sessions' calls."""
        r = self.registry
        self.sandbox_session_start_seconds = Histogram(
            "kuberl_rollout_sandbox_session_start_seconds",
            "Seconds to open a sandbox session for an episode.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.session_calls = Counter(
            "kuberl_rollout_session_calls_total", "Chat completions recorded in sessions.", registry=r
        )
        self.session_history_mismatches = Counter(
            "kuberl_rollout_session_history_mismatches_total",
            "Session calls whose history did not extend the previous call's (a new segment started).",
            registry=r,
        )
        self.session_prompt_tokens = Counter(
            "kuberl_rollout_session_prompt_tokens_total",
            "Prompt tokens of session calls, reused from the previous call's ids or encoded from text.",
            ["source"],
            registry=r,
        )
        for source in ("reused", "encoded"):
            self.session_prompt_tokens.labels(source)

    def _weight_metrics(self) -> None:
        """The served policy and its weight updates."""
        r = self.registry
        self.policy_version = Gauge("kuberl_rollout_policy_version", "Policy version being served.", registry=r)
        self.weight_sync_seconds = Histogram(
            "kuberl_rollout_weight_sync_seconds",
            "Seconds to switch weights (pause to resume).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.weight_sync_bytes = Counter("kuberl_rollout_weight_sync_bytes_total", "Weight bytes received.", registry=r)
        self.episodes_restarted = Counter(
            "kuberl_rollout_episodes_restarted_total",
            "Episodes stopped by a weight update's drain timeout and played again on the new weights.",
            registry=r,
        )


class ImageGauge:
    """A gauge by sandbox image that counts up and down. An image's series goes away at 0, so the thousands of
    images a dataset may name over a run do not stay in every scrape; the default image's (`""`) stays, at 0
    when idle, so a reader of the unlabelled sum always finds the metric."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self.counts: dict[str, int] = {DEFAULT_IMAGE: 0}
        gauge.labels(DEFAULT_IMAGE).set(0)

    def inc(self, amount: int = 1, image: str = DEFAULT_IMAGE) -> None:
        self.set(self.counts.get(image, 0) + amount, image)

    def dec(self, amount: int = 1, image: str = DEFAULT_IMAGE) -> None:
        self.set(self.counts.get(image, 0) - amount, image)

    def set(self, value: int, image: str = DEFAULT_IMAGE) -> None:
        """Like prometheus_client's: a caller that knows no image sets the default's."""
        if value == 0 and image != DEFAULT_IMAGE:
            if self.counts.pop(image, None) is not None:
                self.gauge.remove(image)
            return
        self.counts[image] = value
        self.gauge.labels(image).set(value)

    def value(self, image: str = DEFAULT_IMAGE) -> int:
        return self.counts.get(image, 0)
