"""The sandbox server's HTTP API (FastAPI). Handlers only translate HTTP to SessionManager calls."""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kuberl.api.environment import Snapshot, StepResult, Task, ToolCall
from kuberl.api.sandbox_http import (
    CreateSession,
    ExecRequest,
    ExecResponse,
    PatchRequest,
    ReplaceRequest,
    RestoreSession,
    SessionInfo,
    TestsRequest,
    WriteRequest,
)
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.sessions import SessionError, SessionManager
from kuberl_sandbox.settings import SandboxSettings
from kuberl_sandbox.tools import apply_tool

log = logging.getLogger("kuberl.sandbox")


def initial_observation(task: Task) -> str:
    return task.prompt + "\nFiles: " + ", ".join(sorted(task.files))


class BodyLimit:
    """ASGI middleware answering 413 once a request body passes `limit` bytes (declared or streamed)."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.limit):
            return await self._too_large(send)
        seen = 0

        async def limited_receive() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge
            return message

        try:
            await self.app(scope, limited_receive, send)
        except _TooLarge:
            await self._too_large(send)

    async def _too_large(self, send: Any) -> None:
        response = JSONResponse({"detail": f"request body larger than {self.limit} bytes"}, status_code=413)
        await response({"type": "http"}, None, send)  # type: ignore[arg-type]


class _TooLarge(Exception):
    pass


async def reap_idle_sessions(manager: SessionManager) -> None:
    interval = max(0.2, min(30.0, manager.settings.session_idle_s / 2))
    while True:
        await asyncio.sleep(interval)
        try:
            await manager.close_idle()
        except Exception:  # keep reaping whatever one close did
            log.exception("closing idle sessions failed")


def create_app(settings: SandboxSettings) -> FastAPI:
    """The sandbox server for `settings`; sessions live as long as the app."""
    metrics = SandboxMetrics()
    manager = SessionManager(settings, metrics)
    token = settings.token.encode()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        manager.prepare()
        app.state.ready = True
        reaper = asyncio.create_task(reap_idle_sessions(manager))
        yield
        reaper.cancel()
        await manager.close_all()

    app = FastAPI(title="KubeRL sandbox", version="v1", lifespan=lifespan)
    app.state.ready = False
    app.state.manager = manager
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)

    async def authenticate(authorization: Annotated[str | None, Header()] = None) -> None:
        scheme, _, presented = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.encode(), token):
            raise SessionError(401, "missing or wrong bearer token")

    @app.exception_handler(SessionError)
    async def session_error(request: Request, err: SessionError) -> JSONResponse:
        metrics.errors.labels(str(err.status)).inc()
        headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
        return JSONResponse({"detail": str(err)}, status_code=err.status, headers=headers)

    @app.exception_handler(ws.WorkspaceError)
    async def workspace_error(request: Request, err: ws.WorkspaceError) -> JSONResponse:
        metrics.errors.labels("400").inc()
        return JSONResponse({"detail": str(err)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        metrics.errors.labels("422").inc()
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        return JSONResponse({"detail": "; ".join(problems)}, status_code=422)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> JSONResponse:
        metrics.errors.labels("500").inc()  # a bug: every bad request must get a 4xx instead
        log.exception("internal error on %s %s", request.method, request.url.path)
        return JSONResponse({"detail": f"internal error ({type(err).__name__})"}, status_code=500)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        ready = app.state.ready
        body = {"ready": ready, "sessions": len(manager.sessions), "maxSessions": settings.max_sessions}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    auth = [Depends(authenticate)]

    @app.post("/v1/sessions", dependencies=auth, status_code=201)
    async def create_session(body: CreateSession) -> SessionInfo:
        session = await manager.create(body.task, body.timeout)
        return SessionInfo(
            session_id=session.session_id,
            task_id=body.task.task_id,
            observation=initial_observation(body.task),
            isolated=session.identity.isolated,
            endpoint=settings.advertise_url,
        )

    @app.post("/v1/sessions/restore", dependencies=auth, status_code=201)
    async def restore_session(body: RestoreSession) -> SessionInfo:
        session = await manager.restore(body.task, body.snapshot)
        return SessionInfo(
            session_id=session.session_id,
            task_id=body.task.task_id,
            observation=initial_observation(body.task),
            isolated=session.identity.isolated,
            checksum=body.snapshot.checksum,
            endpoint=settings.advertise_url,
        )

    @app.get("/v1/sessions/{session_id}", dependencies=auth)
    async def describe_session(session_id: str) -> dict[str, Any]:
        s = manager.get(session_id)
        return {
            "sessionId": s.session_id,
            "taskId": s.task.task_id,
            "commands": s.commands,
            "actions": len(s.actions),
            "checksum": await manager.checksum(s),
            "created": s.created,
        }

    @app.post("/v1/sessions/{session_id}/exec", dependencies=auth)
    async def execute(session_id: str, body: ExecRequest) -> ExecResponse:
        result = await manager.execute(manager.get(session_id), body.command, body.timeout)
        return ExecResponse(
            exit_code=result.exit_code,
            output=result.output,
            truncated=result.truncated,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
        )

    @app.get("/v1/sessions/{session_id}/files", dependencies=auth)
    async def read_file(session_id: str, path: Annotated[str, Query(min_length=1)]) -> dict[str, Any]:
        content, cut = await manager.read_file(manager.get(session_id), path, settings.max_body_bytes)
        return {"path": path, "content": content, "truncated": cut}

    @app.post("/v1/sessions/{session_id}/files", dependencies=auth)
    async def write_file(session_id: str, body: WriteRequest) -> dict[str, Any]:
        size = await manager.write_file(manager.get(session_id), body.path, body.content)
        return {"path": body.path, "bytes": size}

    @app.post("/v1/sessions/{session_id}/files/replace", dependencies=auth)
    async def replace_in_file(session_id: str, body: ReplaceRequest) -> dict[str, Any]:
        count = await manager.replace(manager.get(session_id), body.path, body.old, body.new)
        return {"path": body.path, "replaced": count}

    @app.post("/v1/sessions/{session_id}/files/patch", dependencies=auth)
    async def apply_patch(session_id: str, body: PatchRequest) -> ExecResponse:
        result = await manager.apply_patch(manager.get(session_id), body.patch)
        if result.exit_code != 0:
            raise SessionError(400, f"patch did not apply: {result.output.strip()[-500:]}")
        return ExecResponse(
            exit_code=result.exit_code,
            output=result.output,
            truncated=result.truncated,
            timed_out=result.timed_out,
            duration_s=result.duration_s,
        )

    @app.get("/v1/sessions/{session_id}/list", dependencies=auth)
    async def list_directory(session_id: str, path: str = ".") -> dict[str, Any]:
        return {"entries": await manager.list_files(manager.get(session_id), path)}

    @app.post("/v1/sessions/{session_id}/tests", dependencies=auth)
    async def run_tests(session_id: str, body: TestsRequest | None = None) -> dict[str, Any]:
        outcome = await manager.run_tests(manager.get(session_id), hidden=bool(body and body.hidden))
        return {**outcome.as_info(), "output": outcome.output}

    @app.post("/v1/sessions/{session_id}/step", dependencies=auth)
    async def step(session_id: str, call: ToolCall) -> StepResult:
        return await apply_tool(manager, manager.get(session_id), call)

    @app.post("/v1/sessions/{session_id}/snapshot", dependencies=auth)
    async def snapshot(session_id: str) -> Snapshot:
        return await manager.snapshot(manager.get(session_id))

    @app.delete("/v1/sessions/{session_id}", dependencies=auth, status_code=204)
    async def close_session(session_id: str) -> None:
        await manager.close(session_id)

    return app
