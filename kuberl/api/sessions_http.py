"""Recorded sessions of the rollout server (`/v1/sessions`): request and response bodies, used by the server
and its clients alike.

A session gives an agent its own OpenAI base URL (`.../v1/sessions/{id}/openai/v1`) and API key (the bearer
token of that session's routes, and of no other's). Every chat completion
made through it is sampled by the engine and recorded token-in/token-out; closing the session with a reward
turns the record into a `Trajectory`. Keys on the wire are camelCase like the work API's; errors come in
OpenAI's shape (`kuberl.api.openai_http.ErrorResponse`), since OpenAI clients call these routes.
"""

from __future__ import annotations

from pydantic import Field

from kuberl.api.environment import Task
from kuberl.api.rollout_http import RolloutReply, RolloutRequest
from kuberl.api.trajectory import Trajectory


class OpenSession(RolloutRequest):
    """`POST /v1/sessions`: a recorded session for one episode."""

    task_id: str | None = Field(None, min_length=1)
    """A task of the server's job (its id), or None for a session outside the job's tasks."""
    task: Task | None = None
    """A task given in full instead of by id."""
    group_id: str | None = Field(None, min_length=1)
    """The group the trajectory belongs to (default: the session's own id)."""


class SessionInfo(RolloutReply):
    """A session as it stands."""

    id: str
    """The session's id."""
    base_url: str
    """The OpenAI base URL of the session (`.../v1/sessions/{id}/openai/v1`): give it to any OpenAI client."""
    task_id: str
    """The task the episode works on (`external` for a session without one)."""
    group_id: str
    """The group its trajectory joins."""
    calls: int = 0
    """Chat completions recorded so far."""
    segments: int = 0
    """Token records: a call whose history does not extend the previous call's starts a new one."""
    history_mismatches: int = 0
    """Calls whose messages did not start with the previous call's prompt and completion (edited or truncated
    history): each started a new segment."""
    reused_tokens: int = 0
    """Prompt tokens taken from the previous call's ids (never re-tokenised)."""
    encoded_tokens: int = 0
    """Prompt tokens tokenised from text (first prompts, new messages, and mismatched histories)."""
    closed: bool = False
    """The session was closed: its calls are refused and its trajectory is built."""


class OpenedSession(SessionInfo):
    """`POST /v1/sessions` (201): the new session and its API key."""

    api_key: str
    """The session's own bearer token: give it to the OpenAI client with the base URL (`api_key=`). It opens
    this session's routes only; it is shown once, here."""


class CloseSession(RolloutRequest):
    """`POST /v1/sessions/{id}/close`."""

    reward: float | None = None
    """The episode's outcome reward; None lets the environment's reward function score it (sessions of an
    episode the server runs only: a session opened by a client must give its reward)."""


class ClosedSession(RolloutReply):
    """The closed session and the trajectory its calls make."""

    session: SessionInfo
    """The session, closed."""
    trajectory: Trajectory
    """The trajectory: the last segment's tokens, loss mask, log-probs, versions and turns."""
