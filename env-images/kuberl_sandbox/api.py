"""The sandbox server's HTTP app (FastAPI): the body limit, the error handlers, the routers of `routes/`.
Handlers only translate HTTP to SessionManager calls."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from kuberl.tokens import CHALLENGE
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.routes import commands, files, health, sessions
from kuberl_sandbox.session_manager import SessionError, SessionManager
from kuberl_sandbox.settings import SandboxSettings

log = logging.getLogger("kuberl.sandbox")


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
    """The sandbox server for `settings`; sessions live as long as the app. The routes are in `routes/`."""
    manager = SessionManager(settings, SandboxMetrics())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        manager.prepare()
        app.state.ready = True
        reaper = asyncio.create_task(reap_idle_sessions(manager))
        yield
        reaper.cancel()
        await manager.close_all()

    app = FastAPI(title="KubeRL sandbox", version="v1", lifespan=lifespan)
    app.state.ready, app.state.manager, app.state.token = False, manager, settings.token.encode()
    app.add_middleware(BodyLimit, limit=settings.max_body_bytes)
    install_error_handlers(app, manager.metrics)
    for routes in (health.router, sessions.router, commands.router, files.router):
        app.include_router(routes)
    return app


def install_error_handlers(app: FastAPI, metrics: SandboxMetrics) -> None:
    """Every error as `{"detail": ...}` with a 4xx that says what to do; a 500 is a bug, counted and logged."""

    @app.exception_handler(SessionError)
    async def session_error(request: Request, err: SessionError) -> JSONResponse:
        metrics.errors.labels(str(err.status)).inc()
        headers = CHALLENGE if err.status == 401 else None
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
