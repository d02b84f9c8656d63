"""The RLJob state machine, one table row per transition and breaker (no cluster, no clock)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from kuberl.api.breakers import Progress, stop_for
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import SANDBOX_ISOLATED, CheckpointRef, PerTier, Phase, Reason, RLJobStatus
from kuberl_operator.lifecycle import (
    METER_WRITE_S,
    Action,
    ActionKind,
    LearnerStop,
    Observed,
    TierState,
    next_state,
    should_write,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NOW = T0 + timedelta(hours=1)


def spec(**limits) -> RLJobSpec:
    return RLJobSpec.model_validate({"training": {"totalSteps": 100}, "limits": {"retryBudget": 2, **limits}})


def tiers(learner=(2, 2), rollout=(2, 2), sandbox=(1, 1), **extra) -> dict[str, TierState]:
    """(desired, ready) per tier; extra: learner_failed=("p",), rollout_disrupted=(...), ..."""
    out = {}
    for tier, (desired, ready) in (("learner", learner), ("rollout", rollout), ("sandbox", sandbox)):
        out[tier] = TierState(desired, ready, extra.get(f"{tier}_failed", ()), extra.get(f"{tier}_disrupted", ()))
    return out


def queued() -> RLJobSpec:
    return RLJobSpec.model_validate({"scheduling": {"queueName": "team-a"}})


def status(phase: Phase, **fields) -> RLJobStatus:
    return RLJobStatus(phase=phase, **fields)


CKPT = CheckpointRef(step=40, uri="s3://b/ckpt/step-40")

# (name, spec, status, observed, expected phase, expected reason, expected action kinds)
TRANSITIONS = [
    (
        "created",
        spec(),
        status(Phase.PENDING),
        Observed(NOW, tiers(learner=(2, 0))),
        Phase.INITIALIZING,
        Reason.CREATING_WORKERS,
        [],
    ),
    (
        "waiting for pods",
        spec(),
        status(Phase.INITIALIZING),
        Observed(NOW, tiers(rollout=(2, 1))),
        Phase.INITIALIZING,
        None,
        [],
    ),
    ("all ready", spec(), status(Phase.INITIALIZING), Observed(NOW, tiers()), Phase.RUNNING, Reason.TRAINING, []),
    (
        "learner pod failed",
        spec(),
        status(Phase.RUNNING, last_checkpoint=CKPT),
        Observed(NOW, tiers(learner=(2, 1), learner_failed=("j-learner-1",))),
        Phase.RECOVERING,
        Reason.WORKER_LOST,
        [ActionKind.RESTART_LEARNER_GANG],
    ),
    (
        "learner preempted",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(learner=(2, 1), learner_disrupted=("j-learner-0",))),
        Phase.RECOVERING,
        Reason.PREEMPTED,
        [ActionKind.RESTART_LEARNER_GANG],
    ),
    ("recovered", spec(), status(Phase.RECOVERING), Observed(NOW, tiers()), Phase.RUNNING, Reason.TRAINING, []),
    (
        "rollout pod failed",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(rollout=(2, 1), rollout_failed=("j-rollout-1",))),
        Phase.RUNNING,
        None,
        [ActionKind.REPLACE_PODS],
    ),
    (
        "retry budget exhausted",
        spec(),
        status(Phase.RUNNING, restarts=PerTier(learner=2)),
        Observed(NOW, tiers(learner_failed=("j-learner-0",))),
        Phase.FAILED,
        Reason.RETRY_BUDGET_EXHAUSTED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "rollout budget exhausted",
        spec(),
        status(Phase.RUNNING, restarts=PerTier(rollout=2)),
        Observed(NOW, tiers(rollout_failed=("j-rollout-0",))),
        Phase.FAILED,
        Reason.RETRY_BUDGET_EXHAUSTED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "suspended",
        spec().model_copy(update={"suspend": True}),
        status(Phase.RUNNING),
        Observed(NOW, tiers()),
        Phase.SUSPENDED,
        Reason.SUSPENDED_BY_USER,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "resumed",
        spec(),
        status(Phase.SUSPENDED),
        Observed(NOW, tiers(learner=(2, 0))),
        Phase.INITIALIZING,
        Reason.CREATING_WORKERS,
        [ActionKind.APPLY],
    ),
    (
        "queued",
        queued(),
        status(Phase.PENDING),
        Observed(NOW, tiers(learner=(0, 0)), admitted=False),
        Phase.SUSPENDED,
        Reason.WAITING_FOR_ADMISSION,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "admitted",
        queued(),
        status(Phase.SUSPENDED, reason=Reason.WAITING_FOR_ADMISSION),
        Observed(NOW, tiers(learner=(2, 0)), admitted=True),
        Phase.INITIALIZING,
        Reason.CREATING_WORKERS,
        [ActionKind.APPLY],
    ),
    (
        "evicted by kueue",
        queued(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(), admitted=False),
        Phase.SUSPENDED,
        Reason.WAITING_FOR_ADMISSION,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "still queued",
        queued(),
        status(Phase.SUSPENDED, reason=Reason.WAITING_FOR_ADMISSION),
        Observed(NOW, tiers(learner=(0, 0)), admitted=False),
        Phase.SUSPENDED,
        Reason.WAITING_FOR_ADMISSION,
        [],
    ),
    (
        "at totalSteps the learner is still writing its final checkpoint",
        spec(),
        status(Phase.RUNNING, reason=Reason.TRAINING, step=100),
        Observed(NOW, tiers()),
        Phase.RUNNING,
        Reason.TRAINING,
        [],
    ),
    (
        "completed",
        spec(),
        status(Phase.RUNNING, step=100),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.COMPLETED, "trained training.totalSteps (100)")),
        Phase.SUCCEEDED,
        Reason.COMPLETED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "max steps",
        spec(maxSteps=120).model_copy(update={"training": spec().training.model_copy(update={"total_steps": 200})}),
        status(Phase.RUNNING, step=120),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.MAX_STEPS_REACHED, "reached limits.maxSteps (120)")),
        Phase.STOPPED,
        Reason.MAX_STEPS_REACHED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "max wall clock",
        spec(maxWallClock="1h"),
        status(Phase.RUNNING, running_seconds=3590.0),
        Observed(NOW, tiers(), metered_at=NOW - timedelta(seconds=10)),
        Phase.STOPPED,
        Reason.MAX_WALL_CLOCK_REACHED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "gpu hours",
        spec(maxGpuHours=10.0),
        status(Phase.RUNNING, gpu_hours=9.9),
        Observed(NOW, tiers(), gpus_in_use=8.0, metered_at=NOW - timedelta(minutes=1)),
        Phase.STOPPED,
        Reason.GPU_HOUR_BUDGET_EXHAUSTED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "no progress",
        spec(noProgressTimeout="30m"),
        status(Phase.RUNNING, step=5),
        Observed(NOW, tiers(), last_progress=NOW - timedelta(minutes=31)),
        Phase.FAILED,
        Reason.NO_PROGRESS,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "progress within timeout",
        spec(noProgressTimeout="30m"),
        status(Phase.RUNNING, step=5),
        Observed(NOW, tiers(), last_progress=NOW - timedelta(minutes=29)),
        Phase.RUNNING,
        None,
        [],
    ),
    (
        "learner non-finite loss",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.NON_FINITE_LOSS, "3 steps non-finite")),
        Phase.FAILED,
        Reason.NON_FINITE_LOSS,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "learner mismatch kl",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.MISMATCH_KL_EXCEEDED)),
        Phase.FAILED,
        Reason.MISMATCH_KL_EXCEEDED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "learner found no learning signal",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.NO_LEARNING_SIGNAL, "10 batches without signal")),
        Phase.FAILED,
        Reason.NO_LEARNING_SIGNAL,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "learner reached max steps",
        spec(),
        status(Phase.RUNNING),
        Observed(NOW, tiers(), learner_stop=LearnerStop(Reason.MAX_STEPS_REACHED)),
        Phase.STOPPED,
        Reason.MAX_STEPS_REACHED,
        [ActionKind.SCALE_TO_ZERO],
    ),
    (
        "terminal is final",
        spec(),
        status(Phase.STOPPED, reason=Reason.NO_PROGRESS),
        Observed(NOW, tiers(learner_failed=("x",))),
        Phase.STOPPED,
        Reason.NO_PROGRESS,
        [],
    ),
]


@pytest.mark.parametrize(
    ("spec_", "old", "observed", "phase", "reason", "kinds"),
    [row[1:] for row in TRANSITIONS],
    ids=[row[0] for row in TRANSITIONS],
)
def test_transition(spec_, old, observed, phase, reason, kinds):
    decision = next_state(spec_, old, observed)
    assert decision.status.phase == phase
    assert decision.status.reason == (reason if reason is not None else old.reason)
    assert [a.kind for a in decision.actions] == kinds
    if decision.status.phase != old.phase:
        assert decision.events, "every transition posts an event"
        assert decision.events[-1].reason == str(reason)
    elif not kinds:
        assert not decision.events


@pytest.mark.parametrize(
    "progress",
    [
        Progress(5, 1.0, consecutive_skipped=3, mismatch_kl=0.0),
        Progress(5, 1.0, consecutive_skipped=0, mismatch_kl=1.0),
        Progress(5, 1.0, consecutive_skipped=0, mismatch_kl=0.0, batches_without_signal=10),
        Progress(100, 1.0, consecutive_skipped=0, mismatch_kl=0.0),
    ],
)
def test_a_learner_breaker_gets_the_phase_the_learner_gave_it(progress):
    # the learner reports its reason only (the LearnerStopped condition); the operator must agree on the phase
    limits = spec(maxMismatchKl=0.5)
    tripped = stop_for(limits, progress)
    observed = Observed(NOW, tiers(), learner_stop=LearnerStop(tripped.reason))
    decision = next_state(limits, status(Phase.RUNNING), observed)
    assert (decision.status.phase, decision.status.reason) == (tripped.phase, tripped.reason)


def test_learner_failure_counts_a_restart_and_names_the_checkpoint():
    observed = Observed(NOW, tiers(learner_failed=("j-learner-1",)))
    decision = next_state(spec(), status(Phase.RUNNING, last_checkpoint=CKPT), observed)
    assert decision.status.restarts == PerTier(learner=1)
    assert "checkpoint step 40 (s3://b/ckpt/step-40)" in decision.status.message
    assert decision.actions == (Action(ActionKind.RESTART_LEARNER_GANG, "learner", ("j-learner-1",)),)


def test_preemption_spends_no_retry_budget():
    observed = Observed(NOW, tiers(learner_disrupted=("j-learner-0",), rollout_disrupted=("j-rollout-1",)))
    decision = next_state(spec(), status(Phase.RUNNING, restarts=PerTier(learner=2)), observed)
    assert decision.status.phase == Phase.RECOVERING
    assert decision.status.restarts == PerTier(learner=2)
    assert decision.status.preemptions == 2


def test_rollout_failure_replaces_the_pod_and_leaves_the_learner():
    observed = Observed(NOW, tiers(rollout_failed=("j-rollout-1",)))
    decision = next_state(spec(), status(Phase.RUNNING), observed)
    assert decision.actions == (Action(ActionKind.REPLACE_PODS, "rollout", ("j-rollout-1",)),)
    assert decision.status.restarts == PerTier(rollout=1)
    assert decision.events[0].reason == "WorkerReplaced"


def test_running_sets_start_time_once_and_ready_condition():
    decision = next_state(spec(), status(Phase.INITIALIZING), Observed(NOW, tiers()))
    assert decision.status.start_time == NOW
    ready = {c.type: c for c in decision.status.conditions}["Ready"]
    assert ready.status == "True" and ready.last_transition_time == NOW
    later = next_state(
        spec(),
        decision.status.model_copy(update={"phase": Phase.RECOVERING}),
        Observed(NOW + timedelta(hours=1), tiers()),
    )
    assert later.status.start_time == NOW


def test_wall_clock_excludes_time_suspended():
    metered = NOW - timedelta(minutes=10)
    running = next_state(
        spec(), status(Phase.RUNNING, running_seconds=100.0), Observed(NOW, tiers(), metered_at=metered)
    )
    assert running.status.running_seconds == 700.0
    suspended = next_state(
        spec().model_copy(update={"suspend": True}),
        status(Phase.SUSPENDED, running_seconds=100.0),
        Observed(NOW, tiers(), metered_at=metered),
    )
    assert suspended.status.running_seconds == 100.0


def test_gpu_hours_are_metered_per_tier_and_on_spot():
    observed = Observed(
        NOW,
        tiers(),
        gpus_in_use=10.0,
        gpus_by_tier={"learner": 8.0, "rollout": 2.0},
        spot_gpus_by_tier={"rollout": 2.0},
        metered_at=NOW - timedelta(minutes=30),
    )
    metered = next_state(spec(), status(Phase.RUNNING), observed).status
    assert metered.gpu_hours == 5.0
    assert metered.gpu_hours_by_tier.model_dump() == {"learner": 4.0, "rollout": 1.0, "sandbox": 0.0}
    assert metered.spot_gpu_hours_by_tier.model_dump() == {"learner": 0.0, "rollout": 1.0, "sandbox": 0.0}


def test_gpu_hours_accumulate_from_gpus_in_use():
    observed = Observed(NOW, tiers(), gpus_in_use=4.0, metered_at=NOW - timedelta(minutes=30))
    assert next_state(spec(), status(Phase.RUNNING, gpu_hours=1.0), observed).status.gpu_hours == 3.0


def test_unknown_meter_time_adds_nothing():
    decision = next_state(spec(), status(Phase.RUNNING, running_seconds=5.0), Observed(NOW, tiers(), gpus_in_use=8))
    assert decision.status.running_seconds == 5.0 and decision.status.gpu_hours == 0.0


@pytest.mark.parametrize(
    ("change", "metered_ago", "write"),
    [
        ({}, 5.0, False),
        ({"running_seconds": 105.0}, 5.0, False),
        ({"running_seconds": 105.0}, METER_WRITE_S, True),
        ({"phase": Phase.RECOVERING}, 1.0, True),
        ({"ready_workers": PerTier(learner=1)}, 1.0, True),
    ],
)
def test_status_is_written_only_when_it_changed(change, metered_ago, write):
    old = status(Phase.RUNNING, running_seconds=100.0)
    observed = Observed(NOW, tiers(), metered_at=NOW - timedelta(seconds=metered_ago))
    assert should_write(old, old.model_copy(update=change), observed) is write


def test_a_sandbox_that_cannot_isolate_sessions_shows_in_a_condition_until_sandboxes_are_ready():
    line = "sandbox: cannot isolate sessions: unshare failed: No space left on device"
    running = status(Phase.RUNNING, reason=Reason.TRAINING)
    refused = next_state(spec(), running, Observed(NOW, tiers(sandbox=(1, 0)), sandbox_problem=line)).status
    [condition] = [c for c in refused.conditions if c.type == SANDBOX_ISOLATED]
    assert (condition.status, condition.reason, condition.message) == ("False", "CannotIsolateSessions", line)
    waiting = next_state(spec(), refused, Observed(NOW, tiers(sandbox=(1, 0)))).status
    assert [c.status for c in waiting.conditions if c.type == SANDBOX_ISOLATED] == ["False"]
    fixed = next_state(spec(), waiting, Observed(NOW, tiers())).status
    assert [c.status for c in fixed.conditions if c.type == SANDBOX_ISOLATED] == ["True"]
    quiet = next_state(spec(), running, Observed(NOW, tiers())).status
    assert not any(c.type == SANDBOX_ISOLATED for c in quiet.conditions)
