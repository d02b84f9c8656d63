"""Opening, restoring, describing, snapshotting and closing sessions."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from kuberl.api.environment import Snapshot, Task
from kuberl.api.sandbox_http import CreateSession, RestoreSession, SessionInfo
from kuberl_sandbox.routes.deps import AUTHENTICATED, Manager, SessionOf
from kuberl_sandbox.session_manager import Session

router = APIRouter(dependencies=AUTHENTICATED)


def initial_observation(task: Task, session: Session | None = None) -> str:
    """The prompt and the workspace's files (a repository's top-level entries)."""
    checkout = session.checkout if session is not None else None
    names = checkout.top_level if checkout is not None else sorted(task.files)
    return task.prompt + "\nFiles: " + ", ".join(names)


def _info(manager: Manager, session: Session, task: Task, checksum: str | None = None) -> SessionInfo:
    return SessionInfo(
        session_id=session.session_id,
        task_id=task.task_id,
        observation=initial_observation(task, session),
        isolated=session.identity.isolated,
        checksum=checksum,
        endpoint=manager.settings.advertise_url,
    )


@router.post("/v1/sessions", status_code=201)
async def create_session(body: CreateSession, manager: Manager) -> SessionInfo:
    return _info(manager, await manager.create(body.task, body.timeout), body.task)


@router.post("/v1/sessions/restore", status_code=201)
async def restore_session(body: RestoreSession, manager: Manager) -> SessionInfo:
    session = await manager.restore(body.task, body.snapshot)
    return _info(manager, session, body.task, body.snapshot.checksum)


@router.get("/v1/sessions/{session_id}")
async def describe_session(session: SessionOf, manager: Manager) -> dict[str, Any]:
    return {
        "sessionId": session.session_id,
        "taskId": session.task.task_id,
        "commands": session.commands,
        "actions": len(session.actions),
        "checksum": await manager.checksum(session),
        "created": session.created,
    }


@router.post("/v1/sessions/{session_id}/snapshot")
async def snapshot(session: SessionOf, manager: Manager) -> Snapshot:
    return await manager.snapshot(session)


@router.delete("/v1/sessions/{session_id}", status_code=204)
async def close_session(session_id: str, manager: Manager) -> None:
    await manager.close(session_id)
