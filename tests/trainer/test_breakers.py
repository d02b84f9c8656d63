"""The learner's own stop rules (spec.limits), a pure function."""

from __future__ import annotations

from conftest import with_spec

from kuberl.api.breakers import Progress, stop_for
from kuberl.api.rljob import RLJob
from kuberl.api.status import Phase, Reason


def spec(**changes):
    return RLJob.from_manifest(with_spec(**changes)).spec


def at(step=1, elapsed=1.0, skipped=0, mismatch=0.0, without_signal=0) -> Progress:
    return Progress(step, elapsed, skipped, mismatch, without_signal)


def test_keeps_training_inside_every_limit():
    assert stop_for(spec(training={"totalSteps": 10}), at(step=5)) is None


def test_total_steps_complete_the_job():
    stop = stop_for(spec(training={"totalSteps": 10}), at(step=10))
    assert (stop.phase, stop.reason) == (Phase.SUCCEEDED, Reason.COMPLETED)


def test_max_steps_is_reported_before_completion():
    # the spec requires maxSteps >= totalSteps; at the same step the breaker is what is reported
    stop = stop_for(spec(training={"totalSteps": 3}, limits={"maxSteps": 3}), at(step=3))
    assert (stop.phase, stop.reason) == (Phase.STOPPED, Reason.MAX_STEPS_REACHED)
    assert "maxSteps (3)" in stop.message


def test_wall_clock():
    stop = stop_for(spec(limits={"maxWallClock": "20s"}), at(elapsed=20.5))
    assert (stop.phase, stop.reason) == (Phase.STOPPED, Reason.MAX_WALL_CLOCK_REACHED)
    assert stop_for(spec(limits={"maxWallClock": "20s"}), at(elapsed=19.0)) is None


def test_non_finite_steps_in_a_row_fail_the_job_unless_disabled():
    limits = {"maxNonFiniteSteps": 2}
    assert stop_for(spec(limits=limits), at(skipped=1)) is None
    stop = stop_for(spec(limits=limits), at(skipped=2))
    assert (stop.phase, stop.reason) == (Phase.FAILED, Reason.NON_FINITE_LOSS)
    assert stop_for(spec(limits={**limits, "stopOnNonFiniteLoss": False}), at(skipped=5)) is None


def test_mismatch_kl_bound():
    stop = stop_for(spec(limits={"maxMismatchKl": 0.1}), at(mismatch=0.5))
    assert (stop.phase, stop.reason) == (Phase.FAILED, Reason.MISMATCH_KL_EXCEEDED)
    assert stop_for(spec(limits={"maxMismatchKl": 0.1}), at(mismatch=0.05)) is None


def test_batches_in_a_row_without_learning_signal_fail_the_job():
    limits = {"maxBatchesWithoutSignal": 3}
    assert stop_for(spec(limits=limits), at(without_signal=2)) is None
    stop = stop_for(spec(limits=limits), at(without_signal=3))
    assert (stop.phase, stop.reason) == (Phase.FAILED, Reason.NO_LEARNING_SIGNAL)
    assert "limits.maxBatchesWithoutSignal: 3" in stop.message
    assert spec().limits.max_batches_without_signal == 10 and spec().algorithm.dynamic_sampling


def test_a_job_without_signal_fails_even_at_its_last_step():
    # the failure says more than the limit it happened to reach at the same time
    last_step = spec(training={"totalSteps": 3}, limits={"maxBatchesWithoutSignal": 1})
    stop = stop_for(last_step, at(step=3, without_signal=1))
    assert stop.reason == Reason.NO_LEARNING_SIGNAL
