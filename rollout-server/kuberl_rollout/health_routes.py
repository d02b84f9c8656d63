"""Probes and metrics: `/healthz` (liveness), `/readyz` (readiness), `/metrics` (Prometheus)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kuberl_rollout.state import State

router = APIRouter(include_in_schema=False)


def _engine_dead(request: Request) -> bool:
    rollout = request.app.state.rollout
    return rollout is not None and rollout.service.agent.engine.dead


@router.get("/healthz")
async def healthz(request: Request) -> JSONResponse:
    # liveness: a dead vLLM engine never recovers in-process; failing here gets the server replaced
    if _engine_dead(request):
        return JSONResponse({"status": "engine dead"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    ready = request.app.state.rollout is not None and not _engine_dead(request)
    return JSONResponse({"ready": ready}, status_code=200 if ready else 503)


@router.get("/metrics")
async def metrics(s: State) -> PlainTextResponse:
    return PlainTextResponse(generate_latest(s.metrics.registry), media_type=CONTENT_TYPE_LATEST)
