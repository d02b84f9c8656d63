"""A demonstration: one agent episode as chat messages, the line format of a warm-up dataset.

spec.training.warmup.demonstrations names a JSONL file of these (a local path, file:// or s3://). The warm-up
renders each with the policy's own chat template exactly as the rollout tier lays out an episode (the prompt,
then per turn the call's text and EOS, then the tool's answer and the next assistant header), so a model
fine-tuned on them speaks the format the rollout tier parses. Text, not token ids: one dataset serves every
tokenizer.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Self

from pydantic import Field, model_validator

from kuberl.api.base import ApiModel


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class DemonstrationMessage(ApiModel):
    """One message of the conversation."""

    role: Role
    """system and user open the conversation (the prompt); then assistant (a call) and tool (its answer)
    alternate, starting with assistant."""
    content: str
    """The message's text; an assistant message holds the call as the agent writes it (docs/rollout.md)."""
    train: bool = True
    """Assistant messages only: false shows the call as context without training on it (a failed attempt
    followed by its error and the call made again: the policy learns to recover, never to slip)."""


class Demonstration(ApiModel):
    """One line of a demonstrations file."""

    task_id: str = Field(min_length=1)
    """The task demonstrated (a training task; never a held-out one)."""
    messages: list[DemonstrationMessage] = Field(min_length=2)
    """The conversation: the prompt (system, user), then assistant and tool turns."""
    reward: float | None = None
    """The episode's outcome reward, when known. The landing check scores the demonstrations with a reward
    above 0 (those that solved their task)."""

    @model_validator(mode="after")
    def _check_turns(self) -> Self:
        roles = [m.role for m in self.messages]
        prompt = 0
        while prompt < len(roles) and roles[prompt] in (Role.SYSTEM, Role.USER):
            prompt += 1
        if prompt == 0 or Role.USER not in roles[:prompt]:
            raise ValueError("messages must open with the prompt: a user message (a system message may precede it)")
        for i, role in enumerate(roles[prompt:], start=prompt):
            expected = Role.ASSISTANT if (i - prompt) % 2 == 0 else Role.TOOL
            if role != expected:
                raise ValueError(f"messages[{i}]: expected role {expected} after the prompt's turns, got {role}")
        for i, message in enumerate(self.messages):
            if not message.train and message.role != Role.ASSISTANT:
                raise ValueError(f"messages[{i}]: train: false is for assistant messages only")
        if not any(m.role == Role.ASSISTANT and m.train for m in self.messages):
            raise ValueError("no assistant message to train on (every one has train: false, or there is none)")
        return self
