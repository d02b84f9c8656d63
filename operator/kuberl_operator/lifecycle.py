"""The RLJob state machine: (spec, status, what was observed) -> next status, actions, events. Pure.

Pending -> Initializing -> Running -> (Recovering -> Running) -> Succeeded | Failed | Stopped, and
Suspended while `spec.suspend` holds. Time is an input (`Observed.now`), never read here, so every
transition is a table row in the tests. The handlers do the I/O: they observe the children, call
`next_state`, carry out the actions and write the status when `should_write` says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from kuberl.api.breakers import Progress, backstop_for, clock_started_at, phase_for
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import SANDBOX_ISOLATED, TERMINAL_PHASES, Condition, PerTier, Phase, Reason, RLJobStatus
from kuberl_operator.meta import LEARNER, ROLLOUT, SANDBOX

TIERS = (LEARNER, ROLLOUT, SANDBOX)
# The metered counters change on every observation; writing them that often would turn every job into
# a steady stream of status writes, so they are written at least this often (and with any other change).
METER_WRITE_S = 30.0
_COUNTERS = {"running_seconds", "gpu_hours", "gpu_hours_by_tier", "spot_gpu_hours_by_tier"}
# Phases in which the job's wall clock runs (the breaker counts time since the job started running).
_CLOCK_PHASES = frozenset({Phase.RUNNING, Phase.RECOVERING})


class ActionKind(StrEnum):
    RESTART_LEARNER_GANG = "RestartLearnerGang"  # delete every learner pod: the gang resumes from a checkpoint
    REPLACE_PODS = "ReplacePods"  # delete these pods of one tier; its controller creates new ones
    SCALE_TO_ZERO = "ScaleToZero"  # every tier to zero replicas; the learner's preStop writes a final checkpoint
    APPLY = "Apply"  # every tier back to the spec's replicas (leaving Suspended)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    tier: str | None = None
    pods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class TierState:
    """One tier's pods as observed (terminating pods left out: they were already dealt with)."""

    desired: int
    ready: int = 0
    failed: tuple[str, ...] = ()  # failed pods, preemptions excluded
    disrupted: tuple[str, ...] = ()  # pods with a DisruptionTarget condition (spot preemption, node drain)


@dataclass(frozen=True)
class LearnerStop:
    """The learner's own report that it stopped (its breakers, see kuberl.api.breakers)."""

    reason: Reason
    message: str = ""


@dataclass(frozen=True)
class Observed:
    now: datetime
    tiers: Mapping[str, TierState]
    gpus_in_use: float = 0.0  # GPUs requested by the job's running pods
    gpus_by_tier: Mapping[str, float] = field(default_factory=dict)  # the same per tier (they add up)
    spot_gpus_by_tier: Mapping[str, float] = field(default_factory=dict)  # the part of them on spot nodes
    metered_at: datetime | None = None  # when status.runningSeconds/gpuHours were last written (None: unknown)
    last_progress: datetime | None = None  # when status.step last advanced (None: not seen advancing yet)
    learner_stop: LearnerStop | None = None
    admitted: bool | None = None  # Kueue's admission of a queued job (None: the job is not queued)
    sandbox_problem: str | None = None  # why a sandbox server would not start (None: none said so)


@dataclass(frozen=True)
class Decision:
    status: RLJobStatus
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = field(default_factory=tuple)


def next_state(spec: RLJobSpec, status: RLJobStatus, observed: Observed, generation: int | None = None) -> Decision:
    """The next status and what to do to get there. Terminal phases are final."""
    if status.phase in TERMINAL_PHASES:
        return Decision(status)
    now = observed.now
    new = _metered(status, observed).model_copy(
        update={
            "observed_generation": generation if generation is not None else status.observed_generation,
            "ready_workers": PerTier(**{t: observed.tiers[t].ready for t in TIERS if t in observed.tiers}),
        }
    )
    new = _sandbox_isolation(new, observed)
    if spec.suspend or observed.admitted is False:
        reason = Reason.SUSPENDED_BY_USER if spec.suspend else Reason.WAITING_FOR_ADMISSION
        if status.phase == Phase.SUSPENDED and status.reason == reason:
            return Decision(new)
        why = "spec.suspend is true" if spec.suspend else f"waiting for Kueue (LocalQueue {spec.scheduling.queue_name})"
        message = f"{why}: every tier scaled to zero"
        return _enter(new, now, Phase.SUSPENDED, reason, message, (Action(ActionKind.SCALE_TO_ZERO),))
    if status.phase in (Phase.PENDING, Phase.SUSPENDED):
        checkpoint = status.last_checkpoint
        message = "creating the learner, rollout and sandbox tiers" + (
            f"; the learner resumes from checkpoint step {checkpoint.step} ({checkpoint.uri})" if checkpoint else ""
        )
        # from Pending the create handler has applied the children; from Suspended they are at zero
        actions = (Action(ActionKind.APPLY),) if status.phase == Phase.SUSPENDED else ()
        return _enter(_clock_resumed(new, now), now, Phase.INITIALIZING, Reason.CREATING_WORKERS, message, actions)
    if stop := _breaker(spec, new, observed):
        return stop
    return _workers(spec, new, observed)


def should_write(old: RLJobStatus, new: RLJobStatus, observed: Observed) -> bool:
    """Write on any change but the metered counters, and those at least every METER_WRITE_S."""
    if old.model_dump(exclude=_COUNTERS) != new.model_dump(exclude=_COUNTERS):
        return True
    if old.model_dump(include=_COUNTERS) == new.model_dump(include=_COUNTERS):
        return False
    return observed.metered_at is None or (observed.now - observed.metered_at).total_seconds() >= METER_WRITE_S


def _metered(status: RLJobStatus, observed: Observed) -> RLJobStatus:
    """Add the time since the counters were written. Every phase change writes them, so the stored phase
    held for that whole interval."""
    if observed.metered_at is None:
        return status  # after an operator restart: the interval is unknown, so it is not guessed
    hours = max(0.0, (observed.now - observed.metered_at).total_seconds()) / 3600.0
    seconds = hours * 3600.0
    by_tier, spot = status.gpu_hours_by_tier, status.spot_gpu_hours_by_tier
    update: dict[str, object] = {
        "gpu_hours": status.gpu_hours + observed.gpus_in_use * hours,
        "gpu_hours_by_tier": by_tier.model_copy(
            update={t: getattr(by_tier, t) + observed.gpus_by_tier.get(t, 0.0) * hours for t in TIERS}
        ),
        "spot_gpu_hours_by_tier": spot.model_copy(
            update={t: getattr(spot, t) + observed.spot_gpus_by_tier.get(t, 0.0) * hours for t in TIERS}
        ),
    }
    if status.phase in _CLOCK_PHASES:
        update["running_seconds"] = status.running_seconds + seconds
    return status.model_copy(update=update)


def _breaker(spec: RLJobSpec, status: RLJobStatus, observed: Observed) -> Decision | None:
    """The operator's backstop for the job's limits; the learner normally stops itself first."""
    now, limits = observed.now, spec.limits
    if stop := observed.learner_stop:
        message = stop.message or f"the learner stopped: {stop.reason}"
        return _finish(status, now, phase_for(stop.reason), stop.reason, message)
    if limits.max_gpu_hours is not None and status.gpu_hours >= limits.max_gpu_hours:
        message = f"used {status.gpu_hours:.2f} GPU-hours, limits.maxGpuHours is {limits.max_gpu_hours}"
        reason = Reason.GPU_HOUR_BUDGET_EXHAUSTED
        return _finish(status, now, phase_for(reason), reason, message)
    if status.phase not in _CLOCK_PHASES:
        return None
    # the learner's breakers on the wall clock and progress, checked from outside (the same rule as `kuberl run`)
    idle = None
    if status.phase == Phase.RUNNING and observed.last_progress is not None:
        idle = (now - observed.last_progress).total_seconds()
    if tripped := backstop_for(spec, Progress(status.step, status.running_seconds, seconds_since_step=idle)):
        return _finish(status, now, tripped.phase, tripped.reason or Reason.COMPLETED, tripped.message)
    return None


def _workers(spec: RLJobSpec, status: RLJobStatus, observed: Observed) -> Decision:
    """Failures per tier (each failed pod is seen once: the action deletes it), then readiness."""
    now, budget = observed.now, spec.limits.retry_budget
    restarts, preemptions = status.restarts.model_copy(), status.preemptions
    actions: list[Action] = []
    events: list[Event] = []
    learner = observed.tiers.get(LEARNER, TierState(0))
    for tier in (ROLLOUT, SANDBOX):
        state = observed.tiers.get(tier, TierState(0))
        lost = state.failed + state.disrupted
        if not lost:
            continue
        setattr(restarts, tier, getattr(restarts, tier) + len(state.failed))
        preemptions += len(state.disrupted)
        actions.append(Action(ActionKind.REPLACE_PODS, tier, lost))
        events.append(
            Event(
                "Warning",
                "WorkerReplaced",
                f"replacing {tier} pod(s) {', '.join(lost)}"
                f"{' (preempted)' if state.disrupted else ''}; the learner keeps training",
            )
        )
    learner_lost = bool(learner.failed or learner.disrupted)
    if learner.failed:
        restarts.learner += 1
    elif learner.disrupted:
        preemptions += 1
    status = status.model_copy(update={"restarts": restarts, "preemptions": preemptions})
    exhausted = [t for t in TIERS if getattr(restarts, t) > budget]
    if exhausted:
        tier = exhausted[0]
        return _finish(
            status,
            now,
            Phase.FAILED,
            Reason.RETRY_BUDGET_EXHAUSTED,
            f"{getattr(restarts, tier)} {tier} restarts, limits.retryBudget is {budget}",
            events=tuple(events),
        )
    if learner_lost:
        reason = Reason.WORKER_LOST if learner.failed else Reason.PREEMPTED
        pods = learner.failed + learner.disrupted
        checkpoint = status.last_checkpoint
        resume = f"checkpoint step {checkpoint.step} ({checkpoint.uri})" if checkpoint else "scratch (no checkpoint)"
        message = f"learner pod(s) {', '.join(pods)} lost: restarting the learner gang from {resume}"
        actions.append(Action(ActionKind.RESTART_LEARNER_GANG, LEARNER, pods))
        return _enter(status, now, Phase.RECOVERING, reason, message, tuple(actions), tuple(events))
    if status.phase in (Phase.INITIALIZING, Phase.RECOVERING) and _all_ready(observed.tiers):
        if status.start_time is None:
            status = status.model_copy(update={"start_time": now, "clock_start_time": now})
        return _enter(
            status, now, Phase.RUNNING, Reason.TRAINING, "every tier is ready; training", tuple(actions), tuple(events)
        )
    return Decision(status, tuple(actions), tuple(events))


def _clock_resumed(status: RLJobStatus, now: datetime) -> RLJobStatus:
    """A job that ran before (leaving Suspended) moves its clock's start by the time it did not run, before its
    learner pods are made again: they count the wall clock from it."""
    if status.start_time is None:
        return status
    moved = clock_started_at(status.running_seconds, now.timestamp())
    return status.model_copy(update={"clock_start_time": datetime.fromtimestamp(moved, now.tzinfo)})


def _sandbox_isolation(status: RLJobStatus, observed: Observed) -> RLJobStatus:
    """SandboxIsolated: False with the server's reason while one says it cannot isolate sessions; True again
    once sandbox pods are ready and none says so (set only after it was ever False: quiet by default)."""
    problem, now = observed.sandbox_problem, observed.now
    had = next((c for c in status.conditions if c.type == SANDBOX_ISOLATED), None)
    if problem is not None:
        conditions = set_condition(status.conditions, SANDBOX_ISOLATED, False, "CannotIsolateSessions", problem, now)
    elif had is not None and had.status == "False" and SANDBOX in observed.tiers and observed.tiers[SANDBOX].ready > 0:
        conditions = set_condition(status.conditions, SANDBOX_ISOLATED, True, "SessionsIsolated", "", now)
    else:
        return status
    return status.model_copy(update={"conditions": conditions})


def _all_ready(tiers: Mapping[str, TierState]) -> bool:
    return all(tiers[t].ready >= tiers[t].desired for t in TIERS if t in tiers) and LEARNER in tiers


def _enter(
    status: RLJobStatus,
    now: datetime,
    phase: Phase,
    reason: Reason,
    message: str,
    actions: tuple[Action, ...] = (),
    events: tuple[Event, ...] = (),
) -> Decision:
    """A transition: the phase, its reason and conditions, and an event saying so."""
    kind = "Warning" if phase in (Phase.RECOVERING, Phase.FAILED) else "Normal"
    conditions = set_condition(status.conditions, "Ready", phase == Phase.RUNNING, reason, message, now)
    conditions = set_condition(conditions, "Suspended", phase == Phase.SUSPENDED, reason, message, now)
    new = status.model_copy(update={"phase": phase, "reason": reason, "message": message, "conditions": conditions})
    return Decision(new, actions, (*events, Event(kind, str(reason), f"{phase}: {message}")))


def _finish(
    status: RLJobStatus, now: datetime, phase: Phase, reason: Reason, message: str, events: tuple[Event, ...] = ()
) -> Decision:
    """A terminal transition: every tier to zero (the learner checkpoints on the way down)."""
    done = _enter(status.model_copy(update={"completion_time": now}), now, phase, reason, message, events=events)
    return Decision(done.status, (Action(ActionKind.SCALE_TO_ZERO),), done.events)


def set_condition(
    conditions: list[Condition], type_: str, holds: bool, reason: str | Reason, message: str, now: datetime
) -> list[Condition]:
    """Conditions with `type_` set; its transition time moves only when its status flips."""
    status = "True" if holds else "False"
    old = next((c for c in conditions if c.type == type_), None)
    since = old.last_transition_time if old is not None and old.status == status else now
    new = Condition(type=type_, status=status, reason=str(reason), message=message, last_transition_time=since)
    return [*(c for c in conditions if c.type != type_), new]
