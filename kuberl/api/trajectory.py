"""The trajectory: one agent episode, token-in/token-out. Written by the rollout tier, read by the learner.

All per-token arrays are aligned with `token_ids`. Token ids are never decoded and re-encoded on the
way, so what the learner scores is exactly what the engine sampled.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from kuberl.api.base import ApiModel

NOT_GENERATED = -1
"""Policy version recorded for prompt and observation tokens."""


class FinishReason(StrEnum):
    SUBMITTED = "submitted"
    MAX_TURNS = "max_turns"
    MAX_TOKENS = "max_tokens"
    TIMEOUT = "timeout"
    ERROR = "error"


class Turn(ApiModel):
    """One turn: the tokens the policy generated, then the observation the environment returned."""

    start: int = Field(ge=0)
    """Index of the first generated token of the turn."""
    action_end: int = Field(ge=0)
    """One past the last generated token; observation tokens follow up to `end`."""
    end: int = Field(ge=0)
    """One past the last observation token of the turn."""
    reward: float | None = None
    """Intermediate reward given after this turn (None when the reward function gave none)."""
    tool: str | None = None
    """Name of the tool the action called, or None for a malformed call."""


class Trajectory(ApiModel):
    """One finished episode with everything the learner needs for off-policy-aware credit assignment."""

    trajectory_id: str = Field(min_length=1)
    """Unique id."""
    task_id: str = Field(min_length=1)
    """Task the episode solved (or not)."""
    group_id: str = Field(min_length=1)
    """Trajectories of one group share the task and are baselined together."""
    token_ids: list[int] = Field(min_length=1)
    """Prompt, generated and observation tokens, in order."""
    loss_mask: list[int]
    """1 for tokens the policy generated (they get gradient), 0 for prompt and observation tokens."""
    logprobs: list[float]
    """Sampling log-prob of each generated token under the policy that sampled it; 0.0 elsewhere."""
    policy_versions: list[int]
    """Policy version that sampled each generated token; -1 elsewhere."""
    prompt_length: int = Field(ge=1)
    """Tokens of the initial prompt."""
    turns: list[Turn] = Field(default_factory=list)
    """Turn boundaries, in order."""
    final_reward: float
    """Outcome reward of the episode."""
    finish_reason: FinishReason
    """Why the episode ended."""
    resolved: bool | None = None
    """The submission resolved the task (every failToPass and passToPass hidden test passed); False when it did
    not or the episode never submitted; None when the task has no failToPass."""
    tampering: str | None = None
    """Why the sandbox judged the episode's test report forged (e.g. `missing_answers`), if it did: the
    episode scored 0 for it."""
    error: str | None = None
    """Why the episode failed (finish reason `error`): the learner drops it and may re-submit the task."""
    sandbox_session_id: str | None = None
    """Sandbox session the episode ran in."""
    history_mismatches: int = Field(0, ge=0)
    """Model calls of an external agent whose messages did not extend the previous call's prompt and completion
    (it edited or truncated its history): each started a new token record, and the trajectory holds the last
    one, so every trained token is one that was sampled (or the prompt it was sampled from)."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Seconds spent, e.g. {generate: 3.1, environment: 12.4, total: 15.9}."""

    @model_validator(mode="after")
    def _aligned(self) -> Self:
        n = len(self.token_ids)
        for name in ("loss_mask", "logprobs", "policy_versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, token_ids has {n}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss_mask entries must be 0 or 1")
        if any(m and v < 0 for m, v in zip(self.loss_mask, self.policy_versions, strict=True)):
            raise ValueError("every generated token needs the policy version (>= 0) that sampled it")
        if self.prompt_length > n or any(self.loss_mask[: self.prompt_length]):
            raise ValueError("prompt tokens must lie inside token_ids and carry loss_mask 0")
        previous_end = self.prompt_length
        for i, turn in enumerate(self.turns):
            if not previous_end <= turn.start <= turn.action_end <= turn.end <= n:
                raise ValueError(f"turn {i} span [{turn.start}, {turn.action_end}, {turn.end}) is out of order")
            previous_end = turn.end
        return self

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def oldest_version(self) -> int:
        """Oldest policy version that sampled any token: what staleness is measured from."""
        versions = [v for m, v in zip(self.loss_mask, self.policy_versions, strict=True) if m]
        return min(versions) if versions else NOT_GENERATED
