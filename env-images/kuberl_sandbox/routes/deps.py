"""What every route needs: the caller authenticated, and the app's session manager."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request

from kuberl.tokens import bearer_matches
from kuberl_sandbox.session_manager import Session, SessionError, SessionManager


async def authenticate(request: Request, authorization: Annotated[str | None, Header()] = None) -> None:
    """The bearer token, compared in constant time."""
    if not bearer_matches(authorization, request.app.state.token):
        raise SessionError(401, "missing or wrong bearer token")


def manager_of(request: Request) -> SessionManager:
    return request.app.state.manager


Manager = Annotated[SessionManager, Depends(manager_of)]
AUTHENTICATED = [Depends(authenticate)]


def session_of(session_id: str, manager: Manager) -> Session:
    """The session a route's `{session_id}` names (404 when there is none)."""
    return manager.get(session_id)


SessionOf = Annotated[Session, Depends(session_of)]
