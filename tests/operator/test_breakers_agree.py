"""One breaker rule for everyone: the learner, the operator and `kuberl run` end a job in the same phase with
the same reason for every breaker, and the alerts expect exactly that phase.

The learner calls `kuberl.api.breakers.stop_for`, both backstops `backstop_for` (the same rule less the step
limits, which the learner stops itself at); the operator turns the learner's own report (its `LearnerStopped`
condition) into a phase with `phase_for`. These tests drive each of the three
with the situation that trips each breaker and compare what they decide.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from kuberl.api.breakers import LEARNER_STEP_LIMITS, PHASES, Progress, backstop_for, phase_for, stop_for
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Phase, Reason, RLJobStatus
from kuberl_operator.lifecycle import LearnerStop, Observed, TierState, next_state

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 1, 1, 12, tzinfo=UTC)
SPEC = RLJobSpec.model_validate(
    {
        "training": {"totalSteps": 100},
        "limits": {
            "maxSteps": 120,
            "maxWallClock": "1h",
            "noProgressTimeout": "30m",
            "maxMismatchKl": 0.01,
            "maxNonFiniteSteps": 3,
            "maxBatchesWithoutSignal": 5,
        },
    }
)
# What trips each breaker the learner checks, as its Progress after a step.
LEARNER_TRIPS = {
    Reason.NON_FINITE_LOSS: Progress(10, 60, consecutive_skipped=3),
    Reason.MISMATCH_KL_EXCEEDED: Progress(10, 60, mismatch_kl=0.5),
    Reason.NO_LEARNING_SIGNAL: Progress(10, 60, batches_without_signal=5),
    Reason.MAX_STEPS_REACHED: Progress(120, 60),
    Reason.COMPLETED: Progress(100, 60),
    Reason.MAX_WALL_CLOCK_REACHED: Progress(10, 3600),
}
# What the backstops can see: (step, seconds running, seconds since the last step).
OUTSIDE_TRIPS = {
    Reason.MAX_WALL_CLOCK_REACHED: (10, 3600.0, 5.0),
    Reason.NO_PROGRESS: (10, 600.0, 1800.0),
}


def tiers() -> dict[str, TierState]:
    return {t: TierState(1, 1, (), ()) for t in ("learner", "rollout", "sandbox")}


def operator_decides(step: int, running: float, idle: float | None = None, learner: LearnerStop | None = None):
    status = RLJobStatus(phase=Phase.RUNNING, step=step, running_seconds=running)
    last = NOW - timedelta(seconds=idle) if idle is not None else None
    observed = Observed(NOW, tiers(), metered_at=NOW, last_progress=last, learner_stop=learner)
    decided = next_state(SPEC, status, observed).status
    return decided.phase, decided.reason


@pytest.mark.parametrize("reason", list(LEARNER_TRIPS), ids=str)
def test_a_breaker_the_learner_trips_ends_the_job_alike_in_the_operator(reason):
    stop = stop_for(SPEC, LEARNER_TRIPS[reason])
    assert stop is not None and (stop.phase, stop.reason) == (phase_for(reason), reason)
    # the learner reports it with its LearnerStopped condition; the operator ends the job the same way
    assert operator_decides(10, 60, learner=LearnerStop(reason, stop.message)) == (stop.phase, reason)


@pytest.mark.parametrize("reason", list(OUTSIDE_TRIPS), ids=str)
def test_a_breaker_the_backstops_trip_ends_the_job_alike_in_the_operator_and_kuberl_run(reason):
    step, running, idle = OUTSIDE_TRIPS[reason]
    local = backstop_for(SPEC, Progress(step, running, seconds_since_step=idle))
    assert local is not None and (local.phase, local.reason) == (phase_for(reason), reason)
    assert operator_decides(step, running, idle) == (local.phase, reason)


@pytest.mark.parametrize("reason", sorted(LEARNER_STEP_LIMITS), ids=str)
def test_at_a_step_limit_the_backstops_wait_for_the_learners_own_stop(reason):
    """The learner is writing its final checkpoint and exporting the policy: ending the job from outside now
    would scale it to zero under that work and leave an older checkpoint in the status."""
    step = LEARNER_TRIPS[reason].step
    assert backstop_for(SPEC, Progress(step, 60, seconds_since_step=5.0)) is None
    assert operator_decides(step, 60, idle=5.0) == (Phase.RUNNING, None)


def test_no_progress_fails_the_job_everywhere():
    """A hang ends in Failed in the operator and in `kuberl run`, as the alert expects."""
    assert phase_for(Reason.NO_PROGRESS) == Phase.FAILED


def test_every_breaker_reason_has_a_phase():
    breakers = {
        r for r in Reason if r.value.endswith(("Loss", "Progress", "Exceeded", "Signal", "Reached", "Exhausted"))
    }
    assert breakers <= set(PHASES) and PHASES[Reason.COMPLETED] == Phase.SUCCEEDED


def test_the_alerts_expect_the_phase_each_breaker_ends_in():
    """KubeRLJobFailed names every breaker that fails a job and no other; the stopped ones are
    KubeRLJobStoppedByBreaker's (which leaves out failed jobs)."""
    rules = yaml.safe_load((REPO / "charts/kuberl/files/alerts.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    failed = alerts["KubeRLJobFailed"]["annotations"]["description"]
    for reason, phase in PHASES.items():
        if phase == Phase.FAILED:
            assert reason.value in failed, reason
        else:
            assert reason.value not in failed, reason
    assert 'phase="Failed"' in alerts["KubeRLJobStoppedByBreaker"]["expr"]
