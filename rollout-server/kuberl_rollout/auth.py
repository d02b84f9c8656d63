"""Who may call the rollout server. Every route but the probes and `/metrics` asks for the job token
(`Authorization: Bearer <job token>`, `kuberl.tokens`); a recorded session's routes take that session's own API
key instead (handed out when it opens), or the job token. A refusal is a 401 in the route's error shape, decided
before the body is read or the engine is asked anything."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from kuberl.errors import ServiceError
from kuberl.tokens import bearer_matches


class Unauthorized(ServiceError):
    """A caller without the credential a route asks for."""

    def __init__(self, message: str) -> None:
        super().__init__(401, message)


Authorization = Annotated[str | None, Header()]


async def job_caller(request: Request, authorization: Authorization = None) -> None:
    """The caller presents the job token."""
    if not bearer_matches(authorization, request.app.state.job_token):
        raise Unauthorized("missing or wrong job token: send it as 'Authorization: Bearer <token>'")


async def session_caller(session_id: str, request: Request, authorization: Authorization = None) -> None:
    """The caller presents the API key of session `session_id` (or the job token)."""
    if bearer_matches(authorization, request.app.state.job_token):
        return
    rollout = request.app.state.rollout
    key = rollout.service.sessions.api_key(session_id) if rollout is not None else None
    if key is None or not bearer_matches(authorization, key):
        raise Unauthorized(
            f"missing or wrong API key of session {session_id!r}: send the apiKey it was opened with as "
            "'Authorization: Bearer <key>' (the OpenAI client's api_key)"
        )


JOB_TOKEN = [Depends(job_caller)]
"""`dependencies=` of a route (or router) only the job token opens."""
SESSION_KEY = [Depends(session_caller)]
"""`dependencies=` of a route of one session (its path has `{session_id}`)."""
