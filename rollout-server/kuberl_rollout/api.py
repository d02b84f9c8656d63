"""The rollout server's HTTP app: the routers of the learner's work API, weight updates, the OpenAI-compatible
endpoints and the probes, and the error answers they share. Who may call which route is `auth`'s."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from kuberl.api.rollout_http import Problem
from kuberl.errors import ServiceError
from kuberl.tokens import CHALLENGE
from kuberl_rollout import health_routes, openai_routes, session_routes, weight_routes, work_routes
from kuberl_rollout.environment_close import closes_in_background
from kuberl_rollout.state import RolloutState
from kuberl_rollout.weights import WeightError

__all__ = ["RolloutState", "create_app"]


def create_app(build_state, job_token: str, shutdown=None) -> FastAPI:
    """The app; `build_state` is an async callable returning RolloutState once the engine is loaded, `job_token`
    what callers present (`kuberl.tokens`)."""
    if not job_token:
        raise ValueError("the rollout server needs a job token")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.rollout = await build_state()
        yield
        await closes_in_background()  # sandbox sessions of cancelled episodes, each bounded by its close timeout
        if shutdown is not None:
            shutdown()

    app = FastAPI(title="KubeRL rollout server", version="v1", lifespan=lifespan)
    app.state.rollout, app.state.job_token = None, job_token
    for module in (health_routes, work_routes, weight_routes, openai_routes, session_routes):
        app.include_router(module.router)
    app.add_exception_handler(ServiceError, _service_error)
    app.add_exception_handler(WeightError, _weight_error)
    app.add_exception_handler(RequestValidationError, _invalid_request)
    return app


def _problem(detail: str, status: int) -> JSONResponse:
    headers = CHALLENGE if status == 401 else None
    return JSONResponse(Problem(detail=detail).model_dump(), status_code=status, headers=headers)


async def _service_error(request: Request, err: ServiceError) -> JSONResponse:
    return _problem(str(err), err.status)


async def _weight_error(request: Request, err: WeightError) -> JSONResponse:
    return _problem(str(err), 400)


async def _invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
    problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
    return _problem("; ".join(problems), 422)
