"""The rollout server's HTTP API: the learner's work API, weight updates, OpenAI-compatible endpoints."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from kuberl.api.environment import Task
from kuberl.modeling.tool_calls import ParseError, parse_tool_call
from kuberl_rollout.engine import UpdateMode
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.service import RolloutService, WorkError
from kuberl_rollout.weights import BucketAssembler, WeightError

log = logging.getLogger("kuberl.rollout")


class Body(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SubmitGroup(Body):
    task_id: str | None = None
    task: Task | None = None
    group_size: int = Field(ge=1, le=1024)
    seed: int | None = None


class LoadWeights(Body):
    uri: str = Field(min_length=1)
    version: int = Field(ge=1)


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # OpenAI clients send fields we do not use
    prompt: str | list[int]
    max_tokens: int = Field(16, ge=1, le=65536)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, le=65536)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None


@dataclass
class RolloutState:
    """What the app holds once started (built by `kuberl_rollout.server`)."""

    service: RolloutService
    metrics: RolloutMetrics
    model_name: str
    update_mode: UpdateMode
    assembler: BucketAssembler
    partial_rollouts: bool = False


def create_app(build_state, shutdown=None) -> FastAPI:
    """The app; `build_state` is an async callable returning RolloutState once the engine is loaded."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.rollout = await build_state()
        yield
        if shutdown is not None:
            shutdown()

    app = FastAPI(title="KubeRL rollout server", version="v1", lifespan=lifespan)
    app.state.rollout = None

    def state() -> RolloutState:
        if app.state.rollout is None:
            raise WorkError(503, "the engine is still loading")
        return app.state.rollout

    @app.exception_handler(WorkError)
    async def work_error(request: Request, err: WorkError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=err.status)

    @app.exception_handler(WeightError)
    async def weight_error(request: Request, err: WeightError) -> JSONResponse:
        return JSONResponse({"detail": str(err)}, status_code=400)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in err.errors()]
        return JSONResponse({"detail": "; ".join(problems)}, status_code=422)

    def engine_dead() -> bool:
        return app.state.rollout is not None and app.state.rollout.service.agent.engine.dead

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> JSONResponse:
        # liveness: a dead vLLM engine never recovers in-process; failing here gets the server replaced
        if engine_dead():
            return JSONResponse({"status": "engine dead"}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        ready = app.state.rollout is not None and not engine_dead()
        return JSONResponse({"ready": ready}, status_code=200 if ready else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(state().metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # ------------------------------------------------------------------------- work API (learner)
    @app.post("/v1/groups", status_code=202)
    async def submit(body: SubmitGroup) -> dict[str, Any]:
        if (body.task_id is None) == (body.task is None):
            raise WorkError(422, "give exactly one of taskId or task")
        s = state()
        group = s.service.submit(body.task_id, body.task, body.group_size, body.seed)
        return {**group.describe(), "bootId": s.service.boot_id, "policyVersion": s.service.agent.engine.version}

    @app.get("/v1/groups/{group_id}")
    async def describe(group_id: str) -> dict[str, Any]:
        return state().service.get(group_id).describe()

    @app.delete("/v1/groups/{group_id}")
    async def cancel(group_id: str) -> dict[str, Any]:
        return state().service.cancel(group_id).describe()

    @app.get("/v1/trajectories")
    async def trajectories(
        limit: Annotated[int, Query(ge=1, le=4096)] = 64, wait: Annotated[float, Query(ge=0, le=300)] = 0
    ) -> dict[str, Any]:
        s = state()
        found = await s.service.take(limit, wait)
        return {"bootId": s.service.boot_id, "trajectories": [t.model_dump(mode="json", by_alias=True) for t in found]}

    # ------------------------------------------------------------------------------- weights
    @app.get("/v1/policy")
    async def policy() -> dict[str, Any]:
        s = state()
        return {"version": s.service.agent.engine.version, "bootId": s.service.boot_id}

    @app.put("/v1/weights/{version}/buckets/{index}", status_code=202)
    async def upload_bucket(
        version: int, index: int, request: Request, of: Annotated[int, Query(ge=1, le=100_000)]
    ) -> dict[str, Any]:
        s = state()
        blob = await request.body()
        s.metrics.weight_sync_bytes.inc(len(blob))
        engine = s.service.agent.engine
        if not s.assembler.add(version, index, of, blob, engine.version):
            return {"version": version, "received": len(s.assembler.buckets), "of": of, "applied": False}
        blob = s.assembler.take()
        started = time.monotonic()
        await s.service.switch_policy(lambda: engine.update_weights(blob, version, s.update_mode), s.partial_rollouts)
        s.metrics.weight_sync_seconds.observe(time.monotonic() - started)
        s.metrics.policy_version.set(version)
        return {"version": version, "received": of, "of": of, "applied": True}

    @app.post("/v1/weights/load")
    async def load_weights(body: LoadWeights) -> dict[str, Any]:
        from kuberl.storage import LocalCopyError, local_copy

        s = state()
        engine = s.service.agent.engine
        if body.version <= engine.version:
            raise WeightError(f"version {body.version} is not newer than the served version {engine.version}")
        try:
            folder = await asyncio.to_thread(local_copy, body.uri)  # an S3 download must not stall serving
        except LocalCopyError as err:
            raise WorkError(400, str(err)) from None
        started = time.monotonic()
        await s.service.switch_policy(
            lambda: engine.load_weights(folder, body.version, s.update_mode), s.partial_rollouts
        )
        s.metrics.weight_sync_seconds.observe(time.monotonic() - started)
        s.metrics.policy_version.set(body.version)
        return {"version": body.version, "applied": True}

    # --------------------------------------------------------------------- OpenAI-compatible
    @app.post("/v1/completions")
    async def completions(body: CompletionRequest) -> dict[str, Any]:
        s = state()
        tokenizer = s.service.agent.chat.tokenizer
        prompt_ids = (
            body.prompt if isinstance(body.prompt, list) else tokenizer.encode(body.prompt, add_special_tokens=False)
        )
        if not prompt_ids:
            raise WorkError(400, "prompt is empty")
        if max(prompt_ids) >= len(tokenizer) or min(prompt_ids) < 0:
            raise WorkError(400, f"prompt token ids must lie in [0, {len(tokenizer)})")
        gen = await s.service.agent.engine.generate(
            prompt_ids, body.max_tokens, body.temperature, body.top_p, [tokenizer.eos_token_id], body.seed
        )
        s.metrics.generated_tokens.inc(len(gen.token_ids))
        text = tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        choice = {
            "index": 0,
            "text": text,
            "finish_reason": gen.finish_reason,
            "token_ids": gen.token_ids,
            "policy_versions": gen.versions,
            "logprobs": {"tokens": [tokenizer.decode([t]) for t in gen.token_ids], "token_logprobs": gen.logprobs},
        }
        return _openai("text_completion", s.model_name, prompt_ids, gen.token_ids, choice)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest) -> dict[str, Any]:
        s = state()
        chat = s.service.agent.chat
        try:
            prompt_ids = chat.prompt_ids(body.messages)
        except Exception as err:  # the tokenizer's template raises on messages it cannot render
            raise WorkError(400, f"messages cannot be rendered by the chat template: {err}") from None
        gen = await s.service.agent.engine.generate(
            prompt_ids, body.max_tokens, body.temperature, body.top_p, [chat.tokenizer.eos_token_id], body.seed
        )
        s.metrics.generated_tokens.inc(len(gen.token_ids))
        text = chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        parsed = parse_tool_call(text)
        if not isinstance(parsed, ParseError):
            function = {"name": parsed.name, "arguments": json.dumps(parsed.arguments)}
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function", "function": function}]
        choice = {
            "index": 0,
            "message": message,
            "finish_reason": gen.finish_reason,
            "token_ids": gen.token_ids,
            "policy_versions": gen.versions,
            "logprobs": {
                "content": [
                    {"token": chat.tokenizer.decode([t]), "logprob": lp}
                    for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
                ]
            },
        }
        return _openai("chat.completion", s.model_name, prompt_ids, gen.token_ids, choice)

    return app


def _openai(kind: str, model: str, prompt_ids: list[int], output_ids: list[int], choice: dict) -> dict[str, Any]:
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "prompt_token_ids": prompt_ids,
        "usage": {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": len(output_ids),
            "total_tokens": len(prompt_ids) + len(output_ids),
        },
    }
