"""Errors of the OpenAI-compatible routes, answered in OpenAI's shape (`{"error": {message, type, param, code}}`)
so that OpenAI clients raise with the message (a 400 as `openai.BadRequestError`); the work API keeps its own."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from kuberl.api.openai_http import ErrorDetail, ErrorResponse
from kuberl.errors import ServiceError
from kuberl.tokens import CHALLENGE


class OpenAIError(ServiceError):
    """A request these routes refuse; `param` names the field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(status, message)
        self.param, self.code = param, code


def error_response(status: int, message: str, param: str | None = None, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = ErrorResponse(error=ErrorDetail(message=message, type=kind, param=param, code=code))
    return JSONResponse(body.model_dump(), status_code=status, headers=CHALLENGE if status == 401 else None)


class OpenAIRoute(APIRoute):
    """A route whose errors (invalid bodies, refused requests, the engine still loading) are answered in
    OpenAI's shape; invalid bodies are 400, as OpenAI answers them."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()

        async def answer(request: Request) -> Response:
            try:
                return await handle(request)
            except RequestValidationError as err:
                return _invalid(err)
            except ServiceError as err:
                return error_response(err.status, str(err), getattr(err, "param", None), getattr(err, "code", None))

        return answer


def _invalid(err: RequestValidationError) -> JSONResponse:
    problems, params = [], []
    for e in err.errors():
        loc = list(e["loc"])[1:] if e["loc"][:1] == ("body",) else list(e["loc"])
        param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
        problems.append(f"{param}: {e['msg']}" if param else str(e["msg"]))
        params.append(param or None)
    return error_response(400, "; ".join(problems), params[0], "invalid_value")
