"""`kuberl run JOB.yaml`: the whole RLJob on one machine.

Stages: an optional supervised warm-up (spec.training.warmup), then RL with sandbox servers, rollout
servers and the learner as supervised local processes. The runner is the operator's stand-in: it
restarts crashed processes with back-off against limits.retryBudget, enforces the wall-clock and
no-progress breakers from outside (the learner enforces max steps, non-finite loss and its own
wall clock, and writes a final checkpoint whenever it stops), stops cleanly on Ctrl-C, shows progress,
and leaves in `runs/<job>/`: metrics.jsonl, status.json (the learner's), job.json (the run's outcome,
restarts and process events), prometheus_targets.json (every /metrics endpoint of the run, with the labels a
PodMonitor gives them in a cluster), learning_curve.png, logs/ and checkpoints. With a metrics port it also
serves the job-level metrics (kuberl.job_metrics) that the operator exports for a job in a cluster. Each run
writes a fresh job token to `job-token` (mode 0600): the rollout servers ask every caller for it, as they do
in a cluster.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry, start_http_server
from pydantic import ValidationError

from kuberl.api import env_vars
from kuberl.api.breakers import Progress, Stop, backstop_for, clock_started_at, phase_for, wall_clock_elapsed
from kuberl.api.rljob import RLJob
from kuberl.api.status import PerTier, Phase, Reason, RLJobStatus
from kuberl.job_metrics import JobMetrics
from kuberl.tokens import write_token_file
from kuberl_app.one_machine.plots import plot_learning_curve
from kuberl_app.one_machine.processes import (
    JOB_TOKEN_FILE,
    Ports,
    local_replicas,
    plan,
    prometheus_targets,
    sandbox_scratch,
)
from kuberl_app.one_machine.progress import ProgressPrinter, progress_line
from kuberl_app.one_machine.supervisor import RetryBudgetExhausted, Supervisor
from kuberl_sandbox.local import free_port

POLL_S = 0.5
STOP_GRACE_S = 300.0  # a learner's final checkpoint of a large model takes a while
TARGETS_FILE = "prometheus_targets.json"
# The reason of each phase the runner itself is in (a stopped job's reason is its Stop's).
_RUNNER_REASONS = {
    Phase.PENDING: Reason.CREATED,
    Phase.INITIALIZING: Reason.CREATING_WORKERS,
    Phase.RUNNING: Reason.TRAINING,
    Phase.RECOVERING: Reason.WORKER_LOST,
}


class RunError(RuntimeError):
    """A run that cannot start; the message says what to do."""


@dataclass
class RunRecord:
    """runs/<job>/job.json: what a later `kuberl run --resume` and a reader of the run need."""

    job: str
    phase: str = str(Phase.PENDING)
    reason: str | None = None
    message: str = ""
    step: int = 0
    elapsed_s: float = 0.0  # wall clock spent by every run of this job so far (what maxWallClock limits)
    runs: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    preemptions: dict[str, int] = field(default_factory=dict)  # per tier; never against the retry budget
    evaluations: dict[str, float] = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(self.__dict__, indent=1))

    @staticmethod
    def load(path: Path) -> RunRecord:
        return RunRecord(**json.loads(path.read_text()))


class RunMetrics:
    """`kuberl run --metrics-port`: this job's job-level metrics (kuberl.job_metrics, the ones the operator
    exports in a cluster) from the learner's status.json and the runner's own phase, restarts and ready
    processes, on http://ADDRESS:PORT/metrics."""

    def __init__(self, job: RLJob, run_dir: Path, port: int, address: str = "127.0.0.1") -> None:
        self.namespace, self.name, self.spec = job.metadata.namespace or "default", job.name, job.spec
        self.run_dir, self.learner_ranks = run_dir, job.spec.learner.replicas
        self.sandboxes = local_replicas(job)[0]  # what the runner starts: its "autoscaler" never changes it
        self.registry = CollectorRegistry(auto_describe=True)
        self.jobs = JobMetrics(self.registry)
        self.server, _ = start_http_server(port, address, registry=self.registry)

    def publish(
        self, phase: Phase, running_s: float, supervisor: Supervisor | None = None, stop: Stop | None = None
    ) -> None:
        """The job's status now: the learner's report with the runner's phase (a stop's phase and reason)."""
        try:
            status = RLJobStatus.model_validate(_learner_status(self.run_dir))
        except ValidationError:  # an older learner's file; its step is not worth failing the run for
            status = RLJobStatus()
        update = {
            "phase": phase,
            "reason": _RUNNER_REASONS.get(phase),
            "message": None,
            "running_seconds": running_s,
            "sandbox_replicas": self.sandboxes,
        }
        if stop is not None:
            update.update(phase=stop.phase, reason=stop.reason, message=stop.message)
        if supervisor is not None:
            ready = {tier: 0 for tier in ("learner", "rollout", "sandbox")}
            for name, managed in supervisor.managed.items():
                if supervisor.ready(name):
                    ready[managed.spec.tier] += self.learner_ranks if managed.spec.tier == "learner" else 1
            update.update(
                restarts=PerTier(**supervisor.restarts),
                ready_workers=PerTier(**ready),
                preemptions=sum(supervisor.preemptions.values()),
            )
        self.jobs.observe(self.namespace, self.name, status.model_copy(update=update), self.spec)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_job(
    job: RLJob,
    job_file: Path,
    run_dir: Path,
    model_path: str,
    resume: bool = False,
    out: ProgressPrinter | None = None,
    on_step: Callable[[dict, Supervisor], None] | None = None,
    warm_up: Callable[[str, str], str] | None = None,
    evaluate: Callable[[list[str], str], float] | None = None,
    metrics_port: int | None = None,
    metrics_linger_s: float = 0.0,
    pinning: Mapping[str, frozenset[int]] | None = None,
) -> RunRecord:
    """Run (or with `resume`, continue) the job; returns its record. `on_step` sees every new metrics
    line with the supervisor (tests inject faults with it). `warm_up(model, out_folder)` writes the
    warmed-up model (the first stage, when the job has one) and returns its folder.
    `evaluate(rollout_urls, job_token)` measures the held-out solve rate of what the rollout servers serve: before
    RL (after the warm-up) and after it, while no learner uses them. `metrics_port` serves the job-level
    metrics (RunMetrics), the final status `metrics_linger_s` longer after the job ends (for a scraper).
    `pinning` keeps tiers on cores of their own (`kuberl run --cpus`)."""
    out = out or ProgressPrinter()
    record = _open_record(job, run_dir, resume)
    token, job_token, sandbox_root, ports = _run_resources(job, run_dir, metrics_port)
    # the job's wall clock continues across runs: the learner and the breakers below count from this start
    job_started_at = clock_started_at(record.elapsed_s, time.time())
    stop_requested: list[str] = []
    metrics = _run_metrics(job, run_dir, metrics_port, out)

    def publish(phase: Phase, supervisor: Supervisor | None = None, stop: Stop | None = None) -> None:
        if metrics is not None:
            metrics.publish(phase, wall_clock_elapsed(job_started_at, time.time()), supervisor, stop)

    publish(Phase.INITIALIZING)
    try:  # the metrics server stops however the run ends
        previous_handlers = _catch_stop_signals(stop_requested)
        if warm_up is not None:  # the rollout servers and the learner start from the warmed-up model
            model_path = _warm_up_stage(run_dir, model_path, warm_up, out)
        specs = plan(job, job_file, run_dir, model_path, ports, token, sandbox_root, os.cpu_count() or 1, pinning)
        supervisor = Supervisor(specs, job.spec.limits.retry_budget, log=out.message)
        stop: Stop | None = None
        try:
            run = _Run(job, run_dir, record, job_token, job_started_at, stop_requested, out, publish)
            stop = _train(run, specs, supervisor, ports, evaluate, on_step)
        except RetryBudgetExhausted as err:
            stop = Stop(phase_for(Reason.RETRY_BUDGET_EXHAUSTED), Reason.RETRY_BUDGET_EXHAUSTED, str(err))
        finally:
            if stop is not None:
                publish(stop.phase, supervisor, stop)
            supervisor.stop_all()
            for signum, handler in previous_handlers.items():
                signal.signal(signum, handler)
            _close_record(record, job, run_dir, supervisor, stop, job_started_at)
            if metrics is not None and stop is not None:
                publish(stop.phase, supervisor, stop)  # with the ready processes at zero
                time.sleep(metrics_linger_s)  # the final status stays up for a last scrape
        return record
    finally:
        if metrics is not None:
            metrics.close()


def _run_resources(job: RLJob, run_dir: Path, metrics_port: int | None) -> tuple[str, str, Path, Ports]:
    """(sandbox token, a new job token in RUN_DIR/job-token, the sandboxes' root, the ports) of one run; the
    ports' Prometheus targets go to RUN_DIR/prometheus_targets.json."""
    token = os.environ.get(env_vars.SANDBOX_TOKEN) or secrets.token_hex(16)  # set: to reach the sandboxes too
    job_token = write_token_file(run_dir / JOB_TOKEN_FILE)
    sandbox_root = Path(tempfile.mkdtemp(prefix=f"kuberl-run-{job.name}-", dir=sandbox_scratch(job)))
    os.chmod(sandbox_root, 0o711)  # session users (their own uids) must reach their workspaces
    sandboxes, rollouts, _ = local_replicas(job)
    ports = Ports([free_port() for _ in range(sandboxes)], [free_port() for _ in range(rollouts)], free_port())
    (run_dir / TARGETS_FILE).write_text(json.dumps(prometheus_targets(job, ports, metrics_port), indent=1))
    return token, job_token, sandbox_root, ports


def _catch_stop_signals(received: list[str]) -> dict:
    """SIGINT and SIGTERM noted in `received` (the monitor stops the job on them); returns the handlers before."""

    def on_signal(signum, frame) -> None:
        received.append(signal.Signals(signum).name)

    return {signum: signal.signal(signum, on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}


def _run_metrics(job: RLJob, run_dir: Path, metrics_port: int | None, out: ProgressPrinter) -> RunMetrics | None:
    """The job-level metrics server of `kuberl run --metrics-port`, said where; None without a port."""
    if not metrics_port:
        return None
    out.message(f"job metrics on http://127.0.0.1:{metrics_port}/metrics (every endpoint: {TARGETS_FILE})")
    return RunMetrics(job, run_dir, metrics_port)


def _open_record(job: RLJob, run_dir: Path, resume: bool) -> RunRecord:
    """The job's record for this run: a new one, or with `resume` the previous runs' (refused without it)."""
    record_file = run_dir / "job.json"
    if (record_file.exists() or (run_dir / "metrics.jsonl").exists()) and not resume:
        raise RunError(
            f"{run_dir} holds a previous run of {job.name}: continue it with `kuberl run --resume`, "
            f"or move the folder away to start over"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    record = RunRecord.load(record_file) if record_file.exists() else RunRecord(job.name)
    record.runs += 1
    return record


def _close_record(
    record: RunRecord, job: RLJob, run_dir: Path, supervisor: Supervisor, stop: Stop | None, job_started_at: float
) -> None:
    """The run's outcome into RUN_DIR/job.json, and the learning curve with the evaluations."""
    record.elapsed_s = wall_clock_elapsed(job_started_at, time.time())
    record.restarts = dict(supervisor.restarts)
    record.preemptions = dict(supervisor.preemptions)
    record.events += supervisor.events
    if stop is not None:
        record.phase, record.message = str(stop.phase), stop.message
        record.reason = str(stop.reason) if stop.reason else None
    record.step = _learner_status(run_dir).get("step", record.step)
    record.save(run_dir / "job.json")
    plot_learning_curve(
        _lines(run_dir), run_dir / "learning_curve.png", f"{job.name}: learning curve", record.evaluations
    )


@dataclass(frozen=True)
class _Run:
    """What the stages of one run share."""

    job: RLJob
    run_dir: Path
    record: RunRecord
    job_token: str
    job_started_at: float  # the job's wall clock counts from it (kuberl.api.breakers.clock_started_at)
    stop_requested: list[str]  # the signals received, in order
    out: ProgressPrinter
    publish: Callable[..., None]  # publish(phase, supervisor, stop): the job's status to its metrics


def _train(
    run: _Run,
    specs: list,
    supervisor: Supervisor,
    ports: Ports,
    evaluate: Callable[[list[str], str], float] | None,
    on_step: Callable[[dict, Supervisor], None] | None,
) -> Stop:
    """Sandboxes, then rollout servers, then (after the evaluation before RL) the learner, watched until it
    stops; then the evaluation after RL. Returns why the job stopped."""
    for tier in ("sandbox", "rollout"):
        for s in (s for s in specs if s.tier == tier):
            if tier == "rollout":
                run.out.message(f"starting {s.name} (vLLM; about 20 seconds on CPU)")
            supervisor.start(s.name)
            run.publish(Phase.INITIALIZING, supervisor)
    urls = [f"http://127.0.0.1:{p}" for p in ports.rollouts]
    if evaluate is not None and "before RL" not in run.record.evaluations:
        _evaluation(run, "before RL", lambda: evaluate(urls, run.job_token))
    learner = next(s for s in specs if s.tier == "learner")
    learner.env[env_vars.JOB_STARTED_AT] = str(run.job_started_at)
    supervisor.start(learner.name)
    run.out.message(
        f"training: metrics in {run.run_dir / 'metrics.jsonl'} and on "
        f"http://127.0.0.1:{ports.learner_metrics}/metrics, logs in {run.run_dir / 'logs'}"
    )
    stop = _monitor(
        run.job, run.run_dir, supervisor, run.job_started_at, run.stop_requested, run.out, on_step, run.publish
    )
    run.publish(stop.phase, supervisor, stop)
    if evaluate is not None and stop.phase != Phase.FAILED and not run.stop_requested:
        _evaluation(run, "after RL", lambda: evaluate(urls, run.job_token))
    return stop


def _evaluation(run: _Run, when: str, solve_rate: Callable[[], float]) -> None:
    """The held-out solve rate `when` ("before RL", "after RL") into the record."""
    run.out.message(f"evaluating the held-out tasks {when} ...")
    run.record.evaluations[when] = solve_rate()
    before = run.record.evaluations.get("before RL", float("nan"))
    run.out.message(
        f"held-out solve rate {when}: {run.record.evaluations[when]:.2f}"
        + (f" (before RL: {before:.2f})" if when == "after RL" else "")
    )


def _warm_up_stage(run_dir: Path, model_path: str, warm_up, out: ProgressPrinter) -> str:
    """The warmed-up model folder: made once per job (a resumed run reuses it)."""
    warmed = run_dir / "warmup" / "model"
    if (warmed / "config.json").exists():
        out.message(f"warm-up: done before, using {warmed}")
        return str(warmed)
    out.message("warm-up: supervised fine-tuning on the demonstrations (spec.training.warmup)")
    return warm_up(model_path, str(warmed))


def _monitor(
    job: RLJob,
    run_dir: Path,
    supervisor: Supervisor,
    job_started_at: float,
    stop_requested: list[str],
    out: ProgressPrinter,
    on_step,
    publish,
) -> Stop:
    """Watch the learner until it stops (or a breaker or a signal stops it); `publish(phase, supervisor)`
    is told the job's phase on every poll (Recovering while a crashed process waits to restart)."""
    limits = job.spec.limits
    total = min(job.spec.training.total_steps, limits.max_steps or job.spec.training.total_steps)
    seen = len(_lines(run_dir))
    last_progress = time.monotonic()
    breaker: Stop | None = None
    step_times: list[float] = []
    while True:
        for name, code in supervisor.poll():
            if name == "learner" and code == 0:
                status = _learner_status(run_dir)
                if breaker is not None:
                    return breaker
                phase = status.get("phase", str(Phase.STOPPED))
                return Stop(
                    Phase(phase), Reason(status["reason"]) if status.get("reason") else None, status.get("message", "")
                )
        lines = _lines(run_dir)
        for line in lines[seen:]:
            last_progress = time.monotonic()
            step_times.append(line["step_s"])
            recent = step_times[-10:]
            elapsed = wall_clock_elapsed(job_started_at, time.time())
            out.update(progress_line(line, total, elapsed, sum(recent) / len(recent)))
            if line["step"] % 10 == 0:
                plot_learning_curve(lines, run_dir / "learning_curve.png", f"{job.name}: learning curve")
            if on_step is not None:
                on_step(line, supervisor)
        seen = len(lines)
        down = any(not supervisor.ready(name) for name in supervisor.managed)
        publish(Phase.RECOVERING if down else Phase.RUNNING, supervisor)
        if breaker is None:
            elapsed = wall_clock_elapsed(job_started_at, time.time())
            if stop_requested:
                breaker = Stop(Phase.STOPPED, None, f"stopped by {stop_requested[0]} after a final checkpoint")
            else:  # the job's breakers from outside, as the operator checks them (the same function)
                step = lines[-1]["step"] if lines else 0
                idle = time.monotonic() - last_progress
                breaker = backstop_for(job.spec, Progress(step, elapsed, seconds_since_step=idle))
            if breaker is not None:
                out.message(f"stopping: {breaker.message}")
                supervisor.stop("learner")  # it writes a final checkpoint, then exits
                deadline = time.monotonic() + STOP_GRACE_S
        elif time.monotonic() > deadline or not supervisor.running("learner"):
            if supervisor.running("learner"):
                out.message("the learner did not stop in time; killing it (its last complete checkpoint stands)")
            return breaker
        time.sleep(POLL_S)


def _lines(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = []
    for text in path.read_text().splitlines():
        try:
            lines.append(json.loads(text))
        except json.JSONDecodeError:
            break  # a line being written
    return lines


def _learner_status(run_dir: Path) -> dict:
    path = run_dir / "status.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        return {}
