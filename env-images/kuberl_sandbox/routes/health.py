"""Liveness, readiness and metrics (no token: the kubelet and Prometheus call them)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kuberl_sandbox.routes.deps import Manager

router = APIRouter(include_in_schema=False)


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request, manager: Manager) -> JSONResponse:
    ready = request.app.state.ready
    body = {"ready": ready, "sessions": len(manager.sessions), "maxSessions": manager.settings.max_sessions}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics")
async def prometheus_metrics(manager: Manager) -> PlainTextResponse:
    return PlainTextResponse(generate_latest(manager.metrics.registry), media_type=CONTENT_TYPE_LATEST)
