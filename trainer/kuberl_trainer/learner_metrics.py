"""What the learner shows: Prometheus metrics (names in docs/metrics.md) and a status file the operator
and `kuberl run` read (an RLJob status fragment: phase, reason, step, reward, last checkpoint)."""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from kuberl.api.status import CheckpointRef, Phase, Reason, RLJobStatus

disable_created_metrics()
PHASES = ("wait", "train", "weight_sync", "checkpoint")


class LearnerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._gauges()
        self._counters()
        self._histograms()

    def _gauges(self) -> None:
        r = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"kuberl_learner_{name}", doc, registry=r)

        self.step = gauge("step", "Optimizer steps done.")
        self.policy_version = gauge("policy_version", "Policy version of the learner's weights.")
        self.loss = gauge("loss", "Loss of the latest step.")
        self.reward_mean = gauge("reward_mean", "Mean outcome reward of the latest batch.")
        self.reward_std = gauge("reward_std", "Standard deviation of the outcome reward of the latest batch.")
        self.solve_rate = gauge("solve_rate_ratio", "Fraction of the latest batch with outcome reward >= 1.")
        self.advantage_mean = gauge("advantage_mean", "Mean advantage over the latest batch's generated tokens.")
        self.advantage_std = gauge("advantage_std", "Spread of the advantage over generated tokens.")
        self.kl_ref = gauge("kl_reference", "KL estimate (k3) of the policy to the reference policy.")
        self.entropy = gauge("entropy_nats", "Mean entropy of the policy on generated tokens.")
        self.mismatch_kl = gauge("mismatch_kl", "KL of rollout-engine to learner log-probs of the sampled tokens.")
        self.grad_norm = gauge("grad_norm", "Gradient norm before clipping.")
        self.tokens_per_second = gauge("tokens_per_second", "Trained generated tokens per second of step time.")
        self.uniform_group_ratio = gauge("uniform_group_ratio", "Latest batch: fraction of drawn groups dropped.")
        self.tasks_unusable = gauge(
            "tasks_unusable", "Training tasks left out of the draw: their sandbox image is unusable (cluster)."
        )
        self.last_checkpoint_step = gauge("checkpoint_last_step", "Step of the newest complete checkpoint.")
        self.last_checkpoint_time = gauge(
            "checkpoint_last_timestamp_seconds", "Unix time the newest complete checkpoint was written."
        )

    def _counters(self) -> None:
        r = self.registry
        self.skipped = Counter(
            "kuberl_learner_skipped_steps_total", "Steps skipped for a non-finite loss or gradient.", registry=r
        )
        self.trained_tokens = Counter("kuberl_learner_trained_tokens_total", "Generated tokens trained on.", registry=r)
        self.resubmitted = Counter(
            "kuberl_learner_groups_resubmitted_total",
            "Task groups submitted again (a lost rollout server, a failed episode).",
            registry=r,
        )
        self.groups_dropped = Counter(
            "kuberl_learner_groups_dropped_total",
            "Task groups dropped by dynamic sampling: every trajectory had the same reward.",
            registry=r,
        )
        self.groups_surplus = Counter(
            "kuberl_learner_groups_surplus_total",
            "Task groups generated beyond a sync batch (training.oversampling) and left out.",
            registry=r,
        )
        self.tampered = Counter(
            "kuberl_learner_tampered_trajectories_total",
            "Trajectories whose sandbox judged a test report forged (scored 0).",
            registry=r,
        )
        self.trajectories = Counter(
            "kuberl_learner_trajectories_total", "Trajectories received, by outcome.", ["outcome"], registry=r
        )
        for outcome in ("trained", "failed", "stale"):
            self.trajectories.labels(outcome)

    def _histograms(self) -> None:
        r = self.registry
        self.phase_seconds = Histogram(
            "kuberl_learner_step_phase_seconds",
            "Seconds of one step by phase (wait, train, weight_sync, checkpoint).",
            ["phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=r,
        )
        self.staleness = Histogram(
            "kuberl_learner_trajectory_staleness_versions",
            "Policy versions between a trained trajectory's oldest token and the learner.",
            buckets=(0, 1, 2, 3, 4, 6, 8, 16, 32, 64),
            registry=r,
        )
        for phase in PHASES:
            self.phase_seconds.labels(phase)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)


class StatusFile:
    """The learner's report, rewritten atomically (a reader never sees half a file)."""

    def __init__(self, path: Path, cluster=None) -> None:
        self.path = path
        self.cluster = cluster  # a cluster_status.ClusterStatus in a pod: the same report into the RLJob status
        self.status = RLJobStatus(phase=Phase.RUNNING, reason=Reason.TRAINING, start_time=_now())

    def update(self, force: bool = False, **fields) -> None:
        self.status = self.status.model_copy(update=fields)
        self._write()
        if self.cluster is not None:
            self.cluster.report(self.status, force=force)

    def finish(self, **fields) -> None:
        """The last update: the learner stopped (phase, reason, message say why)."""
        self.status = self.status.model_copy(update=fields)
        self._write()
        if self.cluster is not None:
            self.cluster.stopped(self.status)

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = self.status.model_dump_json(by_alias=True, exclude_none=True, indent=2)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".status-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.path)

    def checkpoint(self, step: int, uri: str, written_at: float) -> None:
        ref = CheckpointRef(step=step, uri=uri, time=datetime.fromtimestamp(written_at, UTC))
        self.update(force=True, last_checkpoint=ref)  # the operator resumes a restarted gang from it


def _now() -> datetime:
    return datetime.now(UTC)
