"""A learner started mid-job (a restarted gang, a resumed `kuberl run`) counts the wall clock from the job's
start (KUBERL_JOB_STARTED_AT), so its breaker fires at the job's deadline, not a whole maxWallClock later."""

from __future__ import annotations

import pytest

from kuberl.api.breakers import Progress, clock_started_at, stop_for, wall_clock_elapsed
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Reason
from kuberl_trainer.learner_loop import job_clock_start

NOW = 1_767_225_600.0
HOUR = 3600.0
SPEC = RLJobSpec.model_validate(
    {"model": {"uri": "s3://models/tiny"}, "checkpoint": {"uri": "s3://ckpt/jobs"}, "limits": {"maxWallClock": "1h"}}
)


def first_check(environ: dict[str, str], now: float):
    """What the learner's first breaker check decides, before any step: its clock from the environment."""
    started_at = job_clock_start(environ, now)
    return stop_for(SPEC, Progress(0, wall_clock_elapsed(started_at, now)))


def test_a_learner_started_after_the_jobs_deadline_stops_at_once():
    stop = first_check({"KUBERL_JOB_STARTED_AT": str(NOW - 2 * HOUR)}, NOW)
    assert stop is not None and stop.reason == Reason.MAX_WALL_CLOCK_REACHED


def test_a_learner_started_mid_job_stops_at_the_jobs_deadline_not_an_hour_after_its_own_start():
    environ = {"KUBERL_JOB_STARTED_AT": f"{NOW - 0.75 * HOUR:.3f}"}
    started_at = job_clock_start(environ, NOW)
    assert stop_for(SPEC, Progress(0, wall_clock_elapsed(started_at, NOW + 0.2 * HOUR))) is None
    stop = stop_for(SPEC, Progress(0, wall_clock_elapsed(started_at, NOW + 0.25 * HOUR)))
    assert stop is not None and stop.reason == Reason.MAX_WALL_CLOCK_REACHED


def test_without_a_start_the_learner_starts_the_jobs_clock():
    assert job_clock_start({}, NOW) == NOW and first_check({}, NOW) is None


def test_a_bad_start_names_the_variable():
    with pytest.raises(ValueError, match="KUBERL_JOB_STARTED_AT='yesterday'"):
        job_clock_start({"KUBERL_JOB_STARTED_AT": "yesterday"}, NOW)


def test_a_resumed_job_counts_only_the_time_it_ran():
    started_at = clock_started_at(running_seconds=0.5 * HOUR, now=NOW)
    assert wall_clock_elapsed(started_at, NOW) == 0.5 * HOUR
    assert wall_clock_elapsed(started_at, NOW - HOUR) == 0.0  # never negative
