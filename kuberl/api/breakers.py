"""The circuit breakers: when a job stops, in which phase, for which reason. One pure function for everyone.

The learner checks it after every step (and stops first, so it can write a final checkpoint); the operator
and `kuberl run` check the same function from outside, as the backstop (`backstop_for`), with what they can
see (the wall clock, the time since the last step). `PHASES` says which phase each stop reason ends in, so a
breaker reported by the learner, tripped by the operator, or tripped by `kuberl run` ends the job the same
way, and the alerts (charts/kuberl/files/alerts.yaml) expect exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Phase, Reason
from kuberl.api.types import parse_duration

PHASES: dict[Reason, Phase] = {
    # the run is broken: failures
    Reason.NON_FINITE_LOSS: Phase.FAILED,
    Reason.MISMATCH_KL_EXCEEDED: Phase.FAILED,
    Reason.NO_LEARNING_SIGNAL: Phase.FAILED,
    Reason.NO_PROGRESS: Phase.FAILED,  # a hang: nothing trains, and a restart will not fix what caused it
    Reason.RETRY_BUDGET_EXHAUSTED: Phase.FAILED,
    Reason.NO_USABLE_IMAGES: Phase.FAILED,  # no training task's environment image can run: nothing to train on
    # a limit the user set was reached: stopped, resumable with a higher limit
    Reason.MAX_STEPS_REACHED: Phase.STOPPED,
    Reason.MAX_WALL_CLOCK_REACHED: Phase.STOPPED,
    Reason.GPU_HOUR_BUDGET_EXHAUSTED: Phase.STOPPED,
    # done
    Reason.COMPLETED: Phase.SUCCEEDED,
}
"""The phase each stop reason ends a job in."""


def phase_for(reason: Reason | None) -> Phase:
    """The phase a stop for `reason` ends in (no reason: stopped on request)."""
    return PHASES.get(reason, Phase.STOPPED) if reason is not None else Phase.STOPPED


@dataclass(frozen=True)
class Progress:
    step: int
    elapsed_seconds: float  # since the job started (not this process)
    consecutive_skipped: int = 0  # steps in a row skipped for a non-finite loss or gradient
    mismatch_kl: float = 0.0
    batches_without_signal: int = 0  # batch-sized runs of dropped equal-reward groups in a row (dynamic sampling)
    seconds_since_step: float | None = None  # since the last training step; None where it is not watched


@dataclass(frozen=True)
class Stop:
    phase: Phase
    reason: Reason | None  # None: stopped on request (a signal), no limit involved
    message: str


def clock_started_at(running_seconds: float, now: float) -> float:
    """When the job's wall clock counts from, for a process that starts at `now` (Unix seconds) in a job that
    has run `running_seconds` so far (status.runningSeconds, or every `kuberl run` of the job together): the
    job's start moved later by the time it did not run (suspended, or between runs), as maxWallClock says."""
    return now - running_seconds


def wall_clock_elapsed(started_at: float, now: float) -> float:
    """Seconds the job has run at `now`, by its clock's start (clock_started_at): Progress.elapsed_seconds."""
    return max(0.0, now - started_at)


def stop_for(spec: RLJobSpec, progress: Progress) -> Stop | None:
    """The first limit `progress` has reached, or None to keep training."""
    reached = _reached(spec, progress)
    return None if reached is None else Stop(phase_for(reached[0]), reached[0], reached[1])


LEARNER_STEP_LIMITS = frozenset({Reason.COMPLETED, Reason.MAX_STEPS_REACHED})
"""The limits the learner reaches at a step boundary and stops itself at, after a final checkpoint and the
exported policy. Tripped from outside, they would end the job (and scale its learner to zero) while that
checkpoint is still being written, with an older one in the status."""


def backstop_for(spec: RLJobSpec, progress: Progress) -> Stop | None:
    """`stop_for` as the operator and `kuberl run` check it from outside, with what they see: the limits on time
    (the wall clock, progress), which a stuck learner cannot check; the step limits are the learner's own."""
    stop = stop_for(spec, progress)
    return stop if stop is not None and stop.reason not in LEARNER_STEP_LIMITS else None


def _reached(spec: RLJobSpec, progress: Progress) -> tuple[Reason, str] | None:
    limits = spec.limits
    if limits.stop_on_non_finite_loss and progress.consecutive_skipped >= limits.max_non_finite_steps:
        return (
            Reason.NON_FINITE_LOSS,
            f"{progress.consecutive_skipped} steps in a row had a non-finite loss or gradient "
            f"(limits.maxNonFiniteSteps: {limits.max_non_finite_steps})",
        )
    if limits.max_mismatch_kl is not None and progress.mismatch_kl > limits.max_mismatch_kl:
        return (
            Reason.MISMATCH_KL_EXCEEDED,
            f"rollout/learner mismatch KL {progress.mismatch_kl:.3g} > limits.maxMismatchKl "
            f"{limits.max_mismatch_kl}: the engines sample from another policy than the learner "
            "trains",
        )
    if progress.batches_without_signal >= limits.max_batches_without_signal:
        return (
            Reason.NO_LEARNING_SIGNAL,
            f"{progress.batches_without_signal} batches in a row had no learning signal: in every group "
            "drawn, all trajectories got the same reward, so dynamic sampling left each out "
            f"(limits.maxBatchesWithoutSignal: {limits.max_batches_without_signal}). The tasks are all "
            "too hard or all too easy for the policy, or the reward does not vary",
        )
    if limits.max_steps is not None and progress.step >= limits.max_steps:
        return (Reason.MAX_STEPS_REACHED, f"reached limits.maxSteps ({limits.max_steps})")
    if progress.step >= spec.training.total_steps:
        return (Reason.COMPLETED, f"trained training.totalSteps ({spec.training.total_steps})")
    wall = parse_duration(limits.max_wall_clock)
    if progress.elapsed_seconds >= wall:
        message = f"ran {progress.elapsed_seconds:.0f} s, limits.maxWallClock is {limits.max_wall_clock}"
        return Reason.MAX_WALL_CLOCK_REACHED, message
    idle = progress.seconds_since_step
    if idle is not None and idle >= parse_duration(limits.no_progress_timeout):
        return (
            Reason.NO_PROGRESS,
            f"no training step for {idle:.0f} s, limits.noProgressTimeout is {limits.no_progress_timeout}",
        )
    return None
