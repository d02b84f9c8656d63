"""The RLJob status: what the operator (or `kuberl run`) observed. Written by KubeRL, read by users."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import Field

from kuberl.api.base import ApiModel


class Phase(StrEnum):
    PENDING = "Pending"
    INITIALIZING = "Initializing"
    RUNNING = "Running"
    RECOVERING = "Recovering"
    SUSPENDED = "Suspended"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.STOPPED})


class Reason(StrEnum):
    """Why the job is in its phase. Breaker reasons name the breaker that tripped."""

    CREATED = "Created"
    WAITING_FOR_ADMISSION = "WaitingForAdmission"
    CREATING_WORKERS = "CreatingWorkers"
    TRAINING = "Training"
    WORKER_LOST = "WorkerLost"
    PREEMPTED = "Preempted"
    SUSPENDED_BY_USER = "SuspendedByUser"
    COMPLETED = "Completed"
    MAX_STEPS_REACHED = "MaxStepsReached"
    MAX_WALL_CLOCK_REACHED = "MaxWallClockReached"
    GPU_HOUR_BUDGET_EXHAUSTED = "GpuHourBudgetExhausted"
    NON_FINITE_LOSS = "NonFiniteLoss"
    NO_PROGRESS = "NoProgress"
    MISMATCH_KL_EXCEEDED = "MismatchKlExceeded"
    NO_LEARNING_SIGNAL = "NoLearningSignal"
    RETRY_BUDGET_EXHAUSTED = "RetryBudgetExhausted"
    INVALID_SPEC = "InvalidSpec"
    NO_USABLE_IMAGES = "NoUsableImages"


LEARNER_STOPPED = "LearnerStopped"
"""The condition the learner sets when it stopped itself (a breaker, or training done); its reason is a `Reason`.
The operator reads it and ends the job with `kuberl.api.breakers.phase_for(reason)`."""
SANDBOX_ISOLATED = "SandboxIsolated"
"""The condition the operator sets from the sandbox pods: False, with the server's own one-line reason, while a
sandbox server refuses to start because the node cannot isolate sessions (no unprivileged user namespaces)."""
LEARNER_FIELDS = ("step", "policyVersion", "lastCheckpoint", "rewardMean", "tokensPerSecond", "staleness")
"""The status fields the learner owns (and writes); the operator owns the phase and the other conditions."""


class Condition(ApiModel):
    """A Kubernetes-style condition (Ready, Progressing, Suspended, ...)."""

    type: str = Field(min_length=1, max_length=316)
    """Condition type, e.g. Ready or Progressing."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str = Field("", max_length=1024)
    """One CamelCase word saying why."""
    message: str = Field("", max_length=32768)
    """Human-readable detail."""
    last_transition_time: datetime | None = None
    """When the status last changed."""
    observed_generation: int | None = Field(None, ge=0)
    """The spec generation the condition was computed from."""


class CheckpointRef(ApiModel):
    """The newest complete checkpoint: the one a restart resumes from."""

    step: int = Field(ge=0)
    """Training step the checkpoint holds."""
    uri: str = Field(max_length=2048)
    """Where it is stored."""
    time: datetime | None = None
    """When its manifest was written."""


class PerTier(ApiModel):
    """A count for each tier."""

    learner: int = Field(0, ge=0)
    """Learner tier."""
    rollout: int = Field(0, ge=0)
    """Rollout tier."""
    sandbox: int = Field(0, ge=0)
    """Sandbox tier."""


class TierHours(ApiModel):
    """GPU-hours for each tier."""

    learner: float = Field(0.0, ge=0.0)
    """Learner tier."""
    rollout: float = Field(0.0, ge=0.0)
    """Rollout tier."""
    sandbox: float = Field(0.0, ge=0.0)
    """Sandbox tier."""


class SandboxPoolStatus(ApiModel):
    """One environment image's sandbox pool, as the operator sees it."""

    image: str = Field(min_length=1, max_length=512)
    """The image the pool's pods run."""
    pool: str = Field(min_length=1, max_length=63)
    """The pool's name (its Deployment and Service)."""
    replicas: int = Field(0, ge=0)
    """Pods the planner asks for now (0: scaled to zero)."""
    ready: int = Field(0, ge=0)
    """Pods ready to open sessions."""
    unusable: bool = False
    """True: the image cannot run (it cannot be pulled, its pods crash, or it lacks what the server needs); its
    instances are left out of training and their episodes are masked, not scored 0."""
    reason: str | None = Field(None, max_length=256)
    """Why it is unusable, e.g. ImagePullBackOff, CrashLoopBackOff, MissingShell."""
    message: str | None = Field(None, max_length=1024)
    """The detail: the kubelet's or the server's own one-line message."""


class RLJobStatus(ApiModel):
    """Observed state of an RLJob."""

    phase: Phase = Phase.PENDING
    """Pending, Initializing, Running, Recovering, Suspended, Succeeded, Failed or Stopped."""
    reason: Reason | None = None
    """Typed reason for the phase, e.g. MaxWallClockReached."""
    message: str | None = Field(None, max_length=32768)
    """Human-readable detail of the reason."""
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=64,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    """Conditions, one per type."""
    observed_generation: int | None = Field(None, ge=0)
    """The spec generation this status describes."""
    start_time: datetime | None = None
    """When the job first started running."""
    clock_start_time: datetime | None = None
    """When the wall clock counts from: startTime moved later by the time the job was suspended, so the time
    since it is its running time. Learner pods count their wall-clock breaker from it, across gang restarts."""
    running_seconds: float = Field(0.0, ge=0.0)
    """Seconds the job has run since it started, time Suspended excluded: the wall-clock breaker's clock."""
    gpu_hours: float = Field(0.0, ge=0.0)
    """GPU-hours used so far by all tiers (GPU requests times run time): the GPU-hour breaker's meter."""
    gpu_hours_by_tier: TierHours = Field(default_factory=TierHours)
    """GPU-hours per tier (they add up to gpuHours)."""
    spot_gpu_hours_by_tier: TierHours = Field(default_factory=TierHours)
    """The part of gpuHoursByTier used on spot nodes."""
    completion_time: datetime | None = None
    """When the job reached a terminal phase."""
    step: int = Field(0, ge=0)
    """Training steps completed."""
    policy_version: int = Field(0, ge=0)
    """Version of the newest published policy weights."""
    last_checkpoint: CheckpointRef | None = None
    """The newest complete checkpoint."""
    restarts: PerTier = Field(default_factory=PerTier)
    """Worker restarts per tier (failures, not preemptions)."""
    preemptions: int = Field(0, ge=0)
    """Spot preemptions survived; never spends the retry budget."""
    ready_workers: PerTier = Field(default_factory=PerTier)
    """Ready pods per tier."""
    sandbox_replicas: int | None = Field(None, ge=0)
    """Sandbox pods the autoscaler asks for now (between sandbox.minReplicas and maxReplicas)."""
    sandbox_pools: list[SandboxPoolStatus] = Field(default_factory=list, max_length=2000)
    """The per-image sandbox pools that have pods or are unusable (images whose instances name one)."""
    reward_mean: float | None = None
    """Mean trajectory reward of the last step."""
    tokens_per_second: float | None = Field(None, ge=0.0)
    """Generated tokens per second across the rollout tier."""
    staleness: float | None = Field(None, ge=0.0)
    """Mean policy-version lag of the trajectories in the last batch."""
