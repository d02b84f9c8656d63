"""When the learner stops itself: the job's limits, checked after every step (a pure function).

The operator (or `kuberl run`) enforces the same limits from outside as the backstop; the learner stops
first so it can write a final checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Phase, Reason
from kuberl.api.types import parse_duration


@dataclass(frozen=True)
class Progress:
    step: int
    elapsed_seconds: float  # since the job started (not this process)
    consecutive_skipped: int  # steps in a row skipped for a non-finite loss or gradient
    mismatch_kl: float
    batches_without_signal: int = 0  # batch-sized runs of dropped equal-reward groups in a row (dynamic sampling)


@dataclass(frozen=True)
class Stop:
    phase: Phase
    reason: Reason | None  # None: stopped on request (a signal), no limit involved
    message: str


def stop_for(spec: RLJobSpec, progress: Progress) -> Stop | None:
    """The first limit `progress` has reached, or None to keep training."""
    limits = spec.limits
    if limits.stop_on_non_finite_loss and progress.consecutive_skipped >= limits.max_non_finite_steps:
        return Stop(Phase.FAILED, Reason.NON_FINITE_LOSS,
                    f"{progress.consecutive_skipped} steps in a row had a non-finite loss or gradient "
                    f"(limits.maxNonFiniteSteps: {limits.max_non_finite_steps})")  # fmt: skip
    if limits.max_mismatch_kl is not None and progress.mismatch_kl > limits.max_mismatch_kl:
        return Stop(Phase.FAILED, Reason.MISMATCH_KL_EXCEEDED,
                    f"rollout/learner mismatch KL {progress.mismatch_kl:.3g} > limits.maxMismatchKl "
                    f"{limits.max_mismatch_kl}: the engines sample from another policy than the learner "
                    "trains")  # fmt: skip
    if progress.batches_without_signal >= limits.max_batches_without_signal:
        return Stop(Phase.FAILED, Reason.NO_LEARNING_SIGNAL,
                    f"{progress.batches_without_signal} batches in a row had no learning signal: in every group "
                    "drawn, all trajectories got the same reward, so dynamic sampling left each out "
                    f"(limits.maxBatchesWithoutSignal: {limits.max_batches_without_signal}). The tasks are all "
                    "too hard or all too easy for the policy, or the reward does not vary")  # fmt: skip
    if limits.max_steps is not None and progress.step >= limits.max_steps:
        return Stop(Phase.STOPPED, Reason.MAX_STEPS_REACHED, f"reached limits.maxSteps ({limits.max_steps})")
    if progress.step >= spec.training.total_steps:
        return Stop(Phase.SUCCEEDED, Reason.COMPLETED, f"trained training.totalSteps ({spec.training.total_steps})")
    wall = parse_duration(limits.max_wall_clock)
    if progress.elapsed_seconds >= wall:
        message = f"ran {progress.elapsed_seconds:.0f} s, limits.maxWallClock is {limits.max_wall_clock}"
        return Stop(Phase.STOPPED, Reason.MAX_WALL_CLOCK_REACHED, message)
    return None
