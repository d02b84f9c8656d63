"""The learner's RL loop, run by every rank under torchrun (or alone).

Rank 0 drives: it keeps task groups in flight on the rollout servers (`RolloutFeed`), cuts a batch,
and broadcasts it. Every rank trains its rows of the batch with the FSDP-sharded policy; the new
weights are gathered and rank 0 publishes them as the next policy version. Checkpoints are taken every
interval (asynchronously) and once more when the learner stops: at training.totalSteps, at a limit of
spec.limits (`breakers.stop_for`), or on SIGTERM/SIGINT. Every step appends a line to
`metrics.jsonl`, updates the Prometheus metrics and rewrites `status.json`.
"""

from __future__ import annotations

import json
import math
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from kuberl.api import env_vars
from kuberl.api.breakers import Progress, Stop, stop_for, wall_clock_elapsed
from kuberl.api.rljob import RLJob
from kuberl.api.spec import RLJobSpec, TrainingMode, TrainingSpec
from kuberl.api.status import Phase
from kuberl_trainer.adapters import trainable_parameters
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import (
    collate,
    filters_uniform_groups,
    group_advantages,
    has_signal,
    shard,
    uses_value_head,
    with_gae,
)
from kuberl_trainer.checkpoints.store import CheckpointStore
from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
from kuberl_trainer.cluster_status import ClusterStatus
from kuberl_trainer.distributed import all_reduce_sums, broadcast_object, init_distributed
from kuberl_trainer.export import export_policy, policy_buckets
from kuberl_trainer.learner_metrics import PHASES, LearnerMetrics, StatusFile
from kuberl_trainer.policy import load_policy, micro_batch_tokens
from kuberl_trainer.publisher import WeightPublisher
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.rollout_feed import Batch, FeedState, RolloutFeed
from kuberl_trainer.step import predict, train_step
from kuberl_trainer.unusable_images import UnusableImages, cluster_unusable_images
from kuberl_trainer.weight_transport import transport_for


class StopSignal:
    """SIGTERM / SIGINT ask for a clean stop (a final checkpoint), not an abrupt exit."""

    def __init__(self) -> None:
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:
        self.requested = True


@dataclass
class Driver:
    """Rank 0's connections to the outside: rollout servers, metrics, status."""

    feed: RolloutFeed
    publisher: WeightPublisher
    client: RolloutClient
    metrics: LearnerMetrics
    status: StatusFile
    unusable: UnusableImages | None = None
    """Training tasks left out for an unusable sandbox image (in a cluster)."""


def loss_config_for(job: RLJob) -> LossConfig:
    algorithm = job.spec.algorithm
    return LossConfig(
        clip_low=algorithm.clip_ratio_low,
        clip_high=algorithm.clip_ratio_high,
        off_policy=algorithm.off_policy_correction.mode,
        cap=algorithm.off_policy_correction.cap,
        aggregation=str(algorithm.loss_aggregation),
        kl_coef=algorithm.kl_coef,
        entropy_coef=algorithm.entropy_coef,
        # greedy sampling (0) has no distribution to match: its tokens are scored under the untempered policy
        temperature=job.spec.rollout.temperature or 1.0,
    )


def learning_rate_at(step: int, training: TrainingSpec) -> float:
    """The learning rate of the update that follows `step` completed steps (linear warm-up, then constant)."""
    if step >= training.lr_warmup_steps:
        return training.learning_rate
    return training.learning_rate * (step + 1) / training.lr_warmup_steps


def job_clock_start(environ: Mapping[str, str], now: float) -> float:
    """When the job's wall clock counts from: KUBERL_JOB_STARTED_AT (Unix seconds; the operator and `kuberl run`
    set it for a job that ran before, kuberl.api.breakers.clock_started_at), else `now`: this learner starts
    the job. Raises ValueError naming the variable when it is not a number."""
    value = environ.get(env_vars.JOB_STARTED_AT)
    if not value:
        return now
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{env_vars.JOB_STARTED_AT}={value!r}: expected Unix seconds, e.g. 1767225600.5") from None


def run_learner(
    job: RLJob,
    rollout_urls: list[str],
    model_path: str,
    run_dir: Path,
    task_ids: list[str],
    job_token: str,
    log: Callable[[dict], None] = print,
    metrics_port: int | None = None,
    job_started_at: float | None = None,
) -> list[dict]:
    """Train until a stop; returns the metrics of every step this process trained. `job_token` is what the
    rollout servers ask for (`kuberl.tokens`); `job_started_at` is when the job's wall clock counts from
    (job_clock_start; unset: now)."""
    learner = _start(job, rollout_urls, model_path, run_dir, task_ids, job_token, metrics_port, job_started_at)
    history: list[dict] = []
    while (stop := _next_stop(learner)) is None:
        line = _one_step(learner, log)
        if line is not None:
            history.append(line)
    _finish(learner, stop, model_path, run_dir, log)
    return history


@dataclass
class _Learner:
    """One learner process's training: what every rank holds, rank 0's driver, and the counters of the
    breakers."""

    spec: RLJobSpec
    run_dir: Path
    rank: int
    world: int
    device: torch.device
    model: Any
    reference: Any
    optimizer: torch.optim.Optimizer
    micro_tokens: int | None
    store: CheckpointStore
    checkpointer: Checkpointer
    state: TrainingState
    driver: Driver | None
    loss_config: LossConfig
    started_at: float  # the job's wall clock counts from it
    stop_signal: StopSignal
    saved_step: int = 0
    saved_at: float = field(default_factory=time.monotonic)
    consecutive_skipped: int = 0
    last_mismatch: float = 0.0

    def progress(self) -> Progress:  # rank 0
        assert self.driver is not None
        return Progress(
            self.state.step,
            wall_clock_elapsed(self.started_at, time.time()),
            self.consecutive_skipped,
            self.last_mismatch,
            self.driver.feed.batches_without_signal,
        )

    def stop_waiting(self) -> bool:  # rank 0: a limit reached while waiting for a batch ends the wait too
        stopped = self.stop_signal.requested or stop_for(self.spec, self.progress()) is not None
        return stopped or _no_usable_images(self.driver) is not None


def _start(
    job: RLJob,
    rollout_urls: list[str],
    model_path: str,
    run_dir: Path,
    task_ids: list[str],
    job_token: str,
    metrics_port: int | None,
    job_started_at: float | None,
) -> _Learner:
    """The policy (and reference, optimizer) restored from the newest checkpoint, rank 0's driver, and the
    weights published under a version newer than any the servers hold."""
    spec = job.spec
    rank, world, device = init_distributed()
    torch.manual_seed(spec.training.seed)
    ppo, lora = uses_value_head(spec.algorithm), spec.model.lora
    model = load_policy(model_path, spec.learner.fsdp, device, value_head=ppo, lora=lora)
    reference = _reference(spec, model_path, device, model)
    optimizer = torch.optim.AdamW(
        trainable_parameters(model), lr=spec.training.learning_rate, weight_decay=spec.training.weight_decay
    )
    store = CheckpointStore(checkpoint_uri(job, run_dir), spec.checkpoint.endpoint_url)
    checkpointer = Checkpointer(store, run_dir / "staging", keep=spec.checkpoint.keep, rank=rank)
    state = checkpointer.restore(model, optimizer) or TrainingState(step=0, policy_version=0)
    stop_signal = StopSignal()
    started_at = job_started_at or time.time()
    driver = _driver(job, rollout_urls, job_token, task_ids, state, run_dir, metrics_port) if rank == 0 else None
    if driver and checkpointer.last_complete:
        driver.status.checkpoint(checkpointer.last_complete.step, store.uri, checkpointer.last_complete.time)
    # the servers may hold newer weights than this learner (steps lost with the previous learner, or a
    # checkpoint older than what they serve): publish ours under a version newer than any served, so a
    # version number always names one set of weights
    served = max(driver.client.served_versions()) if driver else 0
    if broadcast_object(state.step > 0 or served > state.policy_version):
        state.policy_version = broadcast_object(max(served, state.policy_version) + 1)
        _publish(model, driver, state.policy_version)
    return _Learner(
        spec=spec,
        run_dir=run_dir,
        rank=rank,
        world=world,
        device=device,
        model=model,
        reference=reference,
        optimizer=optimizer,
        micro_tokens=micro_batch_tokens(spec, model_path, device),
        store=store,
        checkpointer=checkpointer,
        state=state,
        driver=driver,
        loss_config=loss_config_for(job),
        started_at=started_at,
        stop_signal=stop_signal,
        saved_step=state.step,
    )


def _next_stop(learner: _Learner) -> Stop | None:
    """Rank 0's breakers, an unusable task set, or a signal to any rank (a node drain, a preemption stops the
    whole gang with a final checkpoint), the same on every rank; None: train on."""
    signalled = all_reduce_sums([float(learner.stop_signal.requested)])[0] > 0
    stop = None
    if learner.rank == 0:
        stop = stop_for(learner.spec, learner.progress()) or _no_usable_images(learner.driver)
        stop = stop or (_signalled() if signalled else None)
    return broadcast_object(stop)


def _one_step(learner: _Learner, log: Callable[[dict], None]) -> dict | None:
    """Wait for a batch, train on it, publish the weights, checkpoint when due; rank 0's metrics line (None on
    other ranks, or when no step was trained)."""
    driver, state = learner.driver, learner.state
    began = time.monotonic()
    batch: Batch | None = None
    if driver:
        batch = driver.feed.next_batch(state.policy_version, stop=learner.stop_waiting)
    batch = broadcast_object(batch)
    if batch is None:
        return None  # a stop was requested while waiting: the next check ends the loop
    if not batch.trajectories:  # every episode of every group failed, even when run again
        if driver:
            log({"skipped_batch": True, "failed": batch.failed, "step": state.step})
        return None
    waited = time.monotonic() - began
    trained = time.monotonic()
    collated, report = _train_on(learner, batch)
    trained = time.monotonic() - trained
    synced = time.monotonic()
    _publish(learner.model, driver, state.policy_version)
    synced = time.monotonic() - synced
    checkpointed = time.monotonic()
    _checkpoint_when_due(learner)
    checkpointed = time.monotonic() - checkpointed
    if not driver:
        return None
    total = time.monotonic() - began
    line = _step_line(state, batch, collated, report, waited, trained, synced, checkpointed, total)
    _record(driver, line, report, collated, batch, learner.checkpointer, learner.store.uri, learner.run_dir)
    log(line)
    return line


def _train_on(learner: _Learner, batch: Batch):
    """One optimizer step on `batch` (this rank's shard): advantages, the learning rate of the step, values
    and GAE with a value head; the step and policy version move on. Returns (the collated batch, the report)."""
    spec, state, device = learner.spec, learner.state, learner.device
    ppo = uses_value_head(spec.algorithm)
    collated = collate(batch.trajectories, pad_id=0)
    if not ppo:
        collated.batch.advantages = group_advantages(collated, spec.algorithm)
    for group in learner.optimizer.param_groups:  # from the step, not a scheduler's state: a resumed run agrees
        group["lr"] = learning_rate_at(state.step, spec.training)
    part = shard(collated, learner.rank, learner.world, multiple=spec.training.mini_batches)
    tokens = part.batch
    if ppo:
        temperature = learner.loss_config.temperature
        values = predict(learner.model, tokens.to(device), temperature, micro_batch_tokens=learner.micro_tokens)
        tokens = with_gae(part, values.values.cpu(), spec.algorithm)
    report = train_step(
        learner.model,
        learner.optimizer,
        tokens.to(device),
        learner.loss_config,
        spec.training.max_grad_norm,
        learner.world,
        spec.training.mini_batches,
        learner.reference,
        spec.algorithm.value_coef,
        before_update=learner.checkpointer.ready_for_update,
        micro_batch_tokens=learner.micro_tokens,
    )
    state.step += 1
    state.policy_version += 1
    learner.consecutive_skipped = learner.consecutive_skipped + 1 if report.skipped else 0
    learner.last_mismatch = report.mismatch_kl
    return collated, report


def _checkpoint_when_due(learner: _Learner) -> None:
    """A checkpoint every checkpoint.intervalSteps steps or intervalMinutes minutes, whichever comes first."""
    spec, state = learner.spec, learner.state
    due = state.step - learner.saved_step >= spec.checkpoint.interval_steps or (
        time.monotonic() - learner.saved_at >= 60 * spec.checkpoint.interval_minutes
    )
    if broadcast_object(due):
        _checkpoint(learner.checkpointer, learner.model, learner.optimizer, state, learner.driver)
        learner.saved_step, learner.saved_at = state.step, time.monotonic()


def _finish(learner: _Learner, stop: Stop, model_path: str, run_dir: Path, log: Callable[[dict], None]) -> None:
    """A final checkpoint, the trained policy exported (to S3 with the checkpoints), and rank 0's final status."""
    state, driver, checkpointer = learner.state, learner.driver, learner.checkpointer
    if state.step > learner.saved_step:
        _checkpoint(checkpointer, learner.model, learner.optimizer, state, driver)
    checkpointer.wait()
    # the trained policy as a Hugging Face folder (what users load or serve; the checkpoint is for resuming)
    exported = export_policy(learner.model, model_path, run_dir / "policy", learner.rank, learner.spec.model.lora)
    if driver and exported is not None and learner.store.uri.startswith("s3://"):
        exported = learner.store.upload_export(exported)  # the run folder is lost with the pod
    if not driver:
        return
    driver.publisher.wait()
    if checkpointer.last_complete:
        complete = checkpointer.last_complete
        driver.status.checkpoint(complete.step, learner.store.uri, complete.time)
    driver.status.finish(
        phase=stop.phase, reason=stop.reason, message=stop.message, step=state.step, policy_version=state.policy_version
    )
    log(
        {
            "stopped": str(stop.reason or "signal"),
            "phase": str(stop.phase),
            "message": stop.message,
            "step": state.step,
            "policy": str(exported),
        }
    )
    driver.client.close()


def checkpoint_uri(job: RLJob, run_dir: Path) -> str:
    """Where the job's checkpoints (and stored weights) live: spec.checkpoint.uri, else the run folder."""
    return job.spec.checkpoint.uri or str(run_dir / "checkpoints")


def _reference(spec, model_path: str, device: torch.device, model):
    """The KL reference (klCoef > 0): a frozen copy of the initial policy, or with LoRA the policy itself, whose
    base model is its initial policy (train_step disables the adapters for it)."""
    if not spec.algorithm.kl_coef:
        return None
    if spec.model.lora is not None:
        return model
    return load_policy(model_path, spec.learner.fsdp, device, trainable=False)


def _no_usable_images(driver: Driver | None) -> Stop | None:
    """NoUsableImages once no training task's sandbox image can run (rank 0, in a cluster)."""
    return driver.unusable.stop() if driver is not None and driver.unusable is not None else None


def _signalled() -> Stop:
    return Stop(Phase.STOPPED, None, "stopped by a signal (SIGTERM/SIGINT) after a final checkpoint")


def _driver(
    job: RLJob,
    urls: list[str],
    job_token: str,
    task_ids: list[str],
    state: TrainingState,
    run_dir: Path,
    metrics_port: int | None,
) -> Driver:
    spec = job.spec
    transport = transport_for(spec.rollout.weight_sync, checkpoint_uri(job, run_dir), spec.checkpoint.endpoint_url)
    client = RolloutClient(urls, job_token, transport=transport)
    asynchronous = spec.training.mode == TrainingMode.ASYNC
    saved = FeedState(state.task_cursor, state.pending_trajectories, [tuple(x) for x in state.in_flight])
    publisher = WeightPublisher(client, background=asynchronous)
    groups_per_step = spec.training.trajectories_per_step // spec.algorithm.group_size
    metrics = LearnerMetrics()
    signal_of = partial(has_signal, algorithm=spec.algorithm) if filters_uniform_groups(spec.algorithm) else None
    cluster = ClusterStatus.from_environment()
    unusable = cluster_unusable_images(job, task_ids, cluster, metrics.tasks_unusable.set)
    feed = RolloutFeed(
        client,
        task_ids,
        spec.algorithm.group_size,
        groups_per_step,
        asynchronous,
        spec.training.max_staleness,
        spec.training.seed,
        saved,
        on_restart=publisher.catch_up,
        has_signal=signal_of,
        on_drop=metrics.groups_dropped.inc,
        on_tampered=metrics.tampered.inc,
        oversampling=spec.training.oversampling,
        usable=unusable.usable if unusable is not None else None,
        announce=client.announce,
    )
    if metrics_port is not None:
        metrics.serve(metrics_port)
    status = StatusFile(run_dir / "status.json", cluster)
    status.update(step=state.step, policy_version=state.policy_version)
    return Driver(feed, publisher, client, metrics, status, unusable)


def _publish(model, driver: Driver | None, version: int) -> None:
    buckets = policy_buckets(model)  # every rank takes part in gathering the full weights
    if driver:
        driver.publisher.publish(version, buckets)


def _checkpoint(checkpointer: Checkpointer, model, optimizer, state: TrainingState, driver: Driver | None) -> None:
    if driver:
        feed = driver.feed.state()
        state.task_cursor, state.pending_trajectories, state.in_flight = feed.task_cursor, feed.ready, feed.in_flight
    checkpointer.save(model, optimizer, TrainingState(**state.__dict__))


def _step_line(
    state: TrainingState,
    batch: Batch,
    collated,
    report: dict,
    waited: float,
    trained: float,
    synced: float,
    checkpointed: float,
    total: float,
) -> dict:
    rewards = collated.rewards
    generated = int(collated.batch.loss_mask.sum())
    return {
        "step": state.step,
        "policy_version": state.policy_version,
        "loss": report.loss,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),
        "solve_rate": float((rewards >= 1.0).float().mean()),
        "resolved_rate": sum(t.resolved is True for t in batch.trajectories) / max(len(batch.trajectories), 1),
        "drawn_solve_rate": round(batch.drawn_solve_rate, 4),
        "trajectories": len(batch.trajectories),
        "failed": batch.failed,
        "stale_dropped": batch.stale_dropped,
        "resubmitted": batch.resubmitted,
        "groups_dropped": batch.groups_dropped,
        "groups_surplus": batch.groups_surplus,
        "uniform_group_fraction": round(batch.uniform_group_fraction, 4),
        "tampered": batch.tampered,
        "staleness_mean": sum(batch.staleness) / max(len(batch.staleness), 1),
        "staleness_max": max(batch.staleness, default=0),
        "mismatch_kl": report.mismatch_kl,
        "kl_ref": report.kl_ref,
        "entropy": report.entropy,
        "value_loss": report.value_loss,
        "clip_fraction": report.clip_fraction,
        "grad_norm": report.grad_norm,
        "skipped": report.skipped,
        "generated_tokens": generated,
        "tokens_per_s": round(generated / max(total, 1e-9), 1),
        "wait_s": round(waited, 3),
        "train_s": round(trained, 3),
        "weight_sync_s": round(synced, 3),
        "checkpoint_s": round(checkpointed, 3),
        "step_s": round(total, 3),
        "time": time.time(),
    }


def _record(
    driver: Driver,
    line: dict,
    report: dict,
    collated,
    batch: Batch,
    checkpointer: Checkpointer,
    uri: str,
    run_dir: Path,
) -> None:
    m = driver.metrics
    m.step.set(line["step"])
    m.policy_version.set(line["policy_version"])
    for gauge, key in (
        (m.loss, "loss"),
        (m.reward_mean, "reward_mean"),
        (m.reward_std, "reward_std"),
        (m.solve_rate, "solve_rate"),
        (m.kl_ref, "kl_ref"),
        (m.entropy, "entropy"),
        (m.mismatch_kl, "mismatch_kl"),
        (m.tokens_per_second, "tokens_per_s"),
    ):
        gauge.set(line[key])
    if math.isfinite(line["grad_norm"]):
        m.grad_norm.set(line["grad_norm"])
    advantages = collated.batch.advantages[collated.batch.loss_mask]
    if advantages.numel():
        m.advantage_mean.set(float(advantages.mean()))
        m.advantage_std.set(float(advantages.std(correction=0)))
    m.skipped.inc(line["skipped"])
    m.trained_tokens.inc(line["generated_tokens"])
    m.trajectories.labels("trained").inc(len(batch.trajectories))
    m.trajectories.labels("failed").inc(batch.failed)
    m.trajectories.labels("stale").inc(batch.stale_dropped)
    m.resubmitted.inc(batch.resubmitted)
    m.groups_surplus.inc(batch.groups_surplus)
    m.uniform_group_ratio.set(line["uniform_group_fraction"])
    for phase, key in zip(PHASES, ("wait_s", "train_s", "weight_sync_s", "checkpoint_s"), strict=True):
        m.phase_seconds.labels(phase).observe(line[key])
    for value in batch.staleness:
        m.staleness.observe(value)
    complete = checkpointer.last_complete
    if complete is not None:
        m.last_checkpoint_step.set(complete.step)
        m.last_checkpoint_time.set(complete.time)
        if driver.status.status.last_checkpoint is None or driver.status.status.last_checkpoint.step != complete.step:
            driver.status.checkpoint(complete.step, uri, complete.time)
    driver.status.update(
        step=line["step"],
        policy_version=line["policy_version"],
        reward_mean=line["reward_mean"],
        tokens_per_second=line["tokens_per_s"],
        staleness=line["staleness_mean"],
    )
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(line) + "\n")
