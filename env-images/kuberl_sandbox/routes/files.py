"""The file endpoints: read, write, replace, patch, list (every one under the session's lock and rights)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from kuberl.api.sandbox_http import ExecResponse, PatchRequest, ReplaceRequest, WriteRequest
from kuberl_sandbox.routes.commands import exec_response
from kuberl_sandbox.routes.deps import AUTHENTICATED, Manager, SessionOf
from kuberl_sandbox.session_manager import SessionError

router = APIRouter(dependencies=AUTHENTICATED)


@router.get("/v1/sessions/{session_id}/files")
async def read_file(session: SessionOf, manager: Manager, path: Annotated[str, Query(min_length=1)]) -> dict[str, Any]:
    content, cut = await manager.read_file(session, path, manager.settings.max_body_bytes)
    return {"path": path, "content": content, "truncated": cut}


@router.post("/v1/sessions/{session_id}/files")
async def write_file(session: SessionOf, manager: Manager, body: WriteRequest) -> dict[str, Any]:
    return {"path": body.path, "bytes": await manager.write_file(session, body.path, body.content)}


@router.post("/v1/sessions/{session_id}/files/replace")
async def replace_in_file(session: SessionOf, manager: Manager, body: ReplaceRequest) -> dict[str, Any]:
    return {"path": body.path, "replaced": await manager.replace(session, body.path, body.old, body.new)}


@router.post("/v1/sessions/{session_id}/files/patch")
async def apply_patch(session: SessionOf, manager: Manager, body: PatchRequest) -> ExecResponse:
    result = await manager.apply_patch(session, body.patch)
    if result.exit_code != 0:
        raise SessionError(400, f"patch did not apply: {result.output.strip()[-500:]}")
    return exec_response(result)


@router.get("/v1/sessions/{session_id}/list")
async def list_directory(session: SessionOf, manager: Manager, path: str = ".") -> dict[str, Any]:
    return {"entries": await manager.list_files(session, path)}
