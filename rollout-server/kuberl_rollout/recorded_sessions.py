"""Recorded sessions: an agent's model calls, kept token-in/token-out, turned into a trajectory when it closes.

Each call's messages are rendered by the chat template to text. When that text starts with the previous call's
prompt and completion (as text), the previous ids are reused as they are and only the rest (the new messages
and the next assistant header) is tokenised and appended: the trained tokens are the sampled ones, never a
re-tokenisation of their text. The previous completion matches as sampled or as the agent received it (the
answer's content leaves out special tokens). A call whose text does not start so (the agent edited or truncated its
history) starts a new segment and is counted; the trajectory holds the last segment.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kuberl.api.environment import Task
from kuberl.api.sessions_http import SessionInfo
from kuberl.api.trajectory import FinishReason, Trajectory, Turn
from kuberl.tokens import new_token
from kuberl_rollout.agent import TokenRecord
from kuberl_rollout.engine import Generation
from kuberl_rollout.openai_errors import OpenAIError

EXTERNAL_TASK = "external"
"""The task id of a session opened without a task."""


@dataclass(frozen=True)
class Prompt:
    """The ids a call is sampled from, and how they were made."""

    ids: list[int]
    text: str
    new_segment: bool
    """The ids start a segment (first call, or a history that does not extend the previous call's)."""
    reused: int
    """Leading ids taken from the previous call (0 for a new segment)."""


@dataclass
class RecordedSession:
    """One episode's model calls: the token records (segments) and what the trajectory needs besides."""

    id: str
    task: Task | None
    group_id: str
    base_url: str
    tokenizer: Any
    max_tokens: int | None = None
    """The episode's token budget (prompt, generated and observation tokens); None: only the model's context."""
    episode: bool = False
    """The session belongs to an episode the server runs (an external agent's): the episode delivers its
    trajectory to the learner, and a close without a reward lets the job's reward function score it."""
    segments: list[TokenRecord] = field(default_factory=list)
    calls: int = 0
    history_mismatches: int = 0
    reused_tokens: int = 0
    encoded_tokens: int = 0
    reward: float | None = None
    """The outcome reward the client closed the session with."""
    closed: bool = False
    timings: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "environment": 0.0})
    started: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Calls of one session are recorded one at a time, in the order they arrive."""
    api_key: str = field(default_factory=new_token, repr=False)
    """The bearer token of this session's routes (`kuberl_rollout.auth`)."""
    _last_texts: tuple[str, ...] = ()
    """The previous call's prompt and completion as text: exactly as sampled, and as the agent saw it."""

    @property
    def task_id(self) -> str:
        return self.task.task_id if self.task is not None else EXTERNAL_TASK

    def prompt(self, text: str) -> Prompt:
        """The ids to sample the call whose rendered prompt is `text` from; nothing is recorded yet."""
        current = self.segments[-1] if self.segments else None
        if current is not None:
            for previous in self._last_texts:
                if text.startswith(previous):
                    suffix = self._encode(text[len(previous) :])
                    return Prompt(current.token_ids + suffix, text, False, len(current.token_ids))
        return Prompt(self._encode(text), text, True, 0)

    def budget(self, prompt: Prompt) -> int | None:
        """Tokens the episode may still generate after `prompt`; None when unlimited."""
        return None if self.max_tokens is None else self.max_tokens - len(prompt.ids)

    def record(self, prompt: Prompt, gen: Generation, seconds: float) -> None:
        """Append a finished call: the prompt's new tokens as observation, the generated ones as the action."""
        self.calls += 1
        self.timings["generate"] += seconds
        self.reused_tokens += prompt.reused
        self.encoded_tokens += len(prompt.ids) - prompt.reused
        if prompt.new_segment:
            self.history_mismatches += bool(self.segments)
            self.segments.append(TokenRecord(list(prompt.ids)))
        else:
            record = self.segments[-1]
            record.add_observation(prompt.ids[len(record.token_ids) :])
            if record.turns:  # the new messages are the observation of the previous turn
                record.turns[-1] = record.turns[-1].model_copy(update={"end": len(record.token_ids)})
        record = self.segments[-1]
        start = len(record.token_ids)
        record.add_generated(gen.token_ids, gen.logprobs, gen.versions)
        record.turns.append(Turn(start=start, action_end=len(record.token_ids), end=len(record.token_ids)))
        self._last_texts = (prompt.text + self.tokenizer.decode(gen.token_ids, skip_special_tokens=False),)
        # The answer's content leaves out special tokens: one the model sampled mid-answer is missing from the
        # message the agent sends back, though it is the same answer (its end-of-message token aside, which
        # the template writes back)
        ids, eos = gen.token_ids, self.tokenizer.eos_token_id
        ended = bool(ids) and ids[-1] == eos
        visible = self.tokenizer.decode(ids[:-1] if ended else ids, skip_special_tokens=True)
        visible += self.tokenizer.decode([eos], skip_special_tokens=False) if ended else ""
        if prompt.text + visible != self._last_texts[0]:
            self._last_texts += (prompt.text + visible,)

    def reward_last_turn(self, reward: float | None, tool: str) -> None:
        """Attach an environment step to the latest turn: its tool (the turn's first) and intermediate reward
        (summed over the turn's steps)."""
        if not self.segments or not self.segments[-1].turns:
            return  # a tool called before the first model call belongs to no turn
        turns = self.segments[-1].turns
        last = turns[-1]
        if reward is not None:
            reward += last.reward or 0.0
        turns[-1] = last.model_copy(
            update={"reward": last.reward if reward is None else reward, "tool": last.tool or tool}
        )

    def trajectory(
        self,
        final_reward: float,
        finish: FinishReason,
        fallback_prompt: list[int],
        **fields: Any,
    ) -> Trajectory:
        """The last segment as a trajectory (`fallback_prompt` alone when no call was made)."""
        record = self.segments[-1] if self.segments else TokenRecord(list(fallback_prompt))
        timings = {**self.timings, "total": time.monotonic() - self.started}
        return record.trajectory(
            trajectory_id=self.id,
            task_id=self.task_id,
            group_id=self.group_id,
            final_reward=final_reward,
            finish_reason=finish,
            history_mismatches=self.history_mismatches,
            timings=timings,
            **fields,
        )

    def describe(self) -> SessionInfo:
        return SessionInfo(
            id=self.id,
            base_url=self.base_url,
            task_id=self.task_id,
            group_id=self.group_id,
            calls=self.calls,
            segments=len(self.segments),
            history_mismatches=self.history_mismatches,
            reused_tokens=self.reused_tokens,
            encoded_tokens=self.encoded_tokens,
            closed=self.closed,
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []


class SessionStore:
    """The open sessions, and the last `keep_closed` closed ones (a call to one answers 409, not 404), with the
    API keys of both."""

    def __init__(self, tokenizer: Any, keep_closed: int = 1024) -> None:
        self.tokenizer = tokenizer
        self.open_sessions: dict[str, RecordedSession] = {}
        self.recently_closed: OrderedDict[str, SessionInfo] = OrderedDict()
        self.api_keys: dict[str, str] = {}
        self.keep_closed = keep_closed

    def open(
        self,
        server_url: str,
        task: Task | None,
        group_id: str | None,
        max_tokens: int | None = None,
        episode: bool = False,
    ) -> RecordedSession:
        session_id = uuid.uuid4().hex
        base_url = f"{server_url.rstrip('/')}/v1/sessions/{session_id}/openai/v1"
        session = RecordedSession(
            session_id, task, group_id or session_id, base_url, self.tokenizer, max_tokens, episode
        )
        self.open_sessions[session_id] = session
        self.api_keys[session_id] = session.api_key
        return session

    def api_key(self, session_id: str) -> str | None:
        """The API key of an open or recently closed session; None for one this store does not know."""
        return self.api_keys.get(session_id)

    def get(self, session_id: str) -> RecordedSession:
        """The open session `session_id`; an OpenAI-shaped 409 when it closed, 404 when it is unknown."""
        session = self.open_sessions.get(session_id)
        if session is not None:
            return session
        if session_id in self.recently_closed:
            raise OpenAIError(409, f"session {session_id!r} is closed: open a new session", "session", "session_closed")
        raise OpenAIError(404, f"unknown session {session_id!r}", "session", "session_not_found")

    def describe(self, session_id: str) -> SessionInfo:
        session = self.open_sessions.get(session_id)
        if session is not None:
            return session.describe()
        if session_id in self.recently_closed:
            return self.recently_closed[session_id]
        raise OpenAIError(404, f"unknown session {session_id!r}", "session", "session_not_found")

    def close(self, session: RecordedSession) -> SessionInfo:
        """Mark `session` closed and forget it (but for its description)."""
        session.closed = True
        self.open_sessions.pop(session.id, None)
        info = self.recently_closed[session.id] = session.describe()
        while len(self.recently_closed) > self.keep_closed:
            forgotten, _ = self.recently_closed.popitem(last=False)
            self.api_keys.pop(forgotten, None)
        return info
