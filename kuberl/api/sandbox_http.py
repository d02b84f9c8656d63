"""The sandbox server's HTTP contract: request and response bodies, used by the server and its client alike.

The server (`kuberl sandbox`, env-images/kuberl_sandbox/api.py) validates requests with these models and
answers with them; the rollout tier's client (`kuberl_rollout.sandbox_client`) builds its requests and reads
the answers with the same models, so a field renamed on one side fails on both.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kuberl.api.environment import Snapshot, Task

MAX_COMMAND_CHARS = 100_000
MAX_COMMAND_TIMEOUT_S = 600.0
"""The longest per-command timeout a sandbox server grants (a session asking for more is refused)."""


class Body(BaseModel):
    """camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class CreateSession(Body):
    task: Task
    timeout: float | None = Field(None, description="Default per-command timeout of this session, seconds.")


class RestoreSession(Body):
    task: Task
    snapshot: Snapshot


class SessionInfo(Body):
    session_id: str
    task_id: str
    observation: str
    isolated: bool
    checksum: str | None = None
    endpoint: str | None = None  # where to send this session's later calls (None: where this one went)


class ExecRequest(Body):
    command: str = Field(min_length=1, max_length=MAX_COMMAND_CHARS)
    timeout: float | None = None


class ExecResponse(Body):
    exit_code: int | None
    output: str
    truncated: bool
    timed_out: bool
    duration_s: float


class WriteRequest(Body):
    path: str
    content: str


class ReplaceRequest(Body):
    path: str
    old: str = Field(min_length=1)
    new: str


class PatchRequest(Body):
    patch: str = Field(min_length=1, description="A unified diff with paths relative to the workspace (-p1 style).")


class TestsRequest(Body):
    hidden: bool = False
