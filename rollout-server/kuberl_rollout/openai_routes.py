"""OpenAI-compatible endpoints (`/v1/models`, `/v1/completions`, `/v1/chat/completions`, streamed or not), in
OpenAI's format plus what RL needs recorded: token ids, prompt token ids, policy versions and per-token
log-probs. Bodies are `kuberl.api.openai_http`; every error of these routes is answered in OpenAI's error
shape (the work API keeps its own), so OpenAI clients raise with the message. They ask for the job token (the
OpenAI client's `api_key`); a recorded session's copies of them (`session_routes`) take the session's own key.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from kuberl.api.openai_http import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatLogprobs,
    ChatRequest,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
    Sampling,
    TokenLogprob,
    Usage,
)
from kuberl_rollout import openai_chat, openai_stream
from kuberl_rollout.auth import JOB_TOKEN
from kuberl_rollout.engine import Generation
from kuberl_rollout.openai_errors import OpenAIError, OpenAIRoute
from kuberl_rollout.state import State

log = logging.getLogger("kuberl.rollout")
_STARTED = int(time.time())
COMPLETIONS_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


router = APIRouter(
    prefix="/v1",
    tags=["openai"],
    route_class=OpenAIRoute,
    dependencies=JOB_TOKEN,
    responses={code: {"model": ErrorResponse} for code in (400, 401, 404, 503)},
)


# ------------------------------------------------------------------------------------------------ models
@router.get("/models")
async def models(s: State) -> ModelList:
    return ModelList(data=[card(s)])


@router.get("/models/{model_id:path}")
async def model(model_id: str, s: State) -> ModelCard:
    if model_id != s.model_name:
        raise OpenAIError(404, f"The model {model_id!r} does not exist; this server serves {s.model_name!r}", "model")
    return card(s)


def card(s: State) -> ModelCard:
    return ModelCard(id=s.model_name, created=_STARTED, policy_version=s.service.agent.engine.version)


# ------------------------------------------------------------------------------------------- completions
@router.post("/completions", response_model=None, responses={200: {"model": Completion}})
async def completions(body: CompletionRequest, s: State) -> Completion | StreamingResponse:
    refuse_unsupported(body)
    tokenizer = s.service.agent.chat.tokenizer
    if isinstance(body.prompt, str):
        prompt_ids = tokenizer.encode(body.prompt, add_special_tokens=False)
    else:
        prompt_ids = body.prompt
    if not prompt_ids:
        raise OpenAIError(400, "prompt is empty", "prompt")
    if max(prompt_ids) >= len(tokenizer) or min(prompt_ids) < 0:
        raise OpenAIError(400, f"prompt token ids must lie in [0, {len(tokenizer)})", "prompt")
    gen = await generate(s, prompt_ids, body, body.max_tokens or COMPLETIONS_MAX_TOKENS, "prompt")
    head = _head(s)
    usage = _usage(prompt_ids, gen)
    if body.stream:
        chunks = openai_stream.completion_chunks(head, tokenizer, gen, _stream_usage(body, usage))
        return _event_stream(openai_stream.sse(chunks, prompt_ids))
    logprobs = CompletionLogprobs(tokens=[tokenizer.decode([t]) for t in gen.token_ids], token_logprobs=gen.logprobs)
    choice = CompletionChoice(
        text=tokenizer.decode(gen.token_ids, skip_special_tokens=True),
        logprobs=logprobs,
        finish_reason=gen.finish_reason,
        token_ids=gen.token_ids,
        policy_versions=gen.versions,
    )
    return Completion(**head, choices=[choice], usage=usage, prompt_token_ids=prompt_ids)


# ---------------------------------------------------------------------------------------------- chat
@router.post("/chat/completions", response_model=None, responses={200: {"model": ChatCompletion}})
async def chat_completions(body: ChatRequest, s: State) -> ChatCompletion | StreamingResponse:
    refuse_unsupported(body)
    prompt_ids = openai_chat.prompt_ids(s.service.agent.chat, body)
    gen = await generate(s, prompt_ids, body, chat_max_tokens(body, len(prompt_ids), s.context_tokens), "messages")
    return chat_answer(s, body, prompt_ids, gen)


def chat_max_tokens(body: ChatRequest, prompt_tokens: int, context_tokens: int) -> int:
    """The request's limit, else (as OpenAI and vLLM do) whatever the context has left after the prompt. At
    least 1: a prompt that fills the context is the engine's to refuse, with its own message."""
    return body.max_completion_tokens or body.max_tokens or max(1, context_tokens - prompt_tokens)


def chat_answer(
    s: State, body: ChatRequest, prompt_ids: list[int], gen: Generation
) -> ChatCompletion | StreamingResponse:
    """The answer to a chat request whose generation is `gen`, streamed or not as the request asks."""
    chat = s.service.agent.chat
    text = chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    calls = None if body.tool_choice == "none" else openai_chat.tool_calls(text)
    finish = "tool_calls" if calls and gen.finish_reason == "stop" else gen.finish_reason
    head, usage = _head(s), _usage(prompt_ids, gen)
    if body.stream:
        chunks = openai_stream.chat_chunks(head, chat.tokenizer, gen, calls, finish, _stream_usage(body, usage))
        return _event_stream(openai_stream.sse(chunks, prompt_ids))
    tokens = [
        TokenLogprob(token=chat.tokenizer.decode([t]), logprob=lp)
        for t, lp in zip(gen.token_ids, gen.logprobs, strict=True)
    ]
    choice = ChatChoice(
        message=AssistantMessage(content=text, tool_calls=calls),
        logprobs=ChatLogprobs(content=tokens),
        finish_reason=finish,
        token_ids=gen.token_ids,
        policy_versions=gen.versions,
    )
    return ChatCompletion(**head, choices=[choice], usage=usage, prompt_token_ids=prompt_ids)


# ------------------------------------------------------------------------------------ not served here
@router.post("/responses", include_in_schema=False)
async def responses() -> None:
    raise OpenAIError(404, "the Responses API is not served here; use /v1/chat/completions", code="unsupported")


@router.post("/embeddings", include_in_schema=False)
async def embeddings() -> None:
    raise OpenAIError(404, "embeddings are not served here: a rollout server only samples", code="unsupported")


# --------------------------------------------------------------------------------------------- shared
def refuse_unsupported(body: Sampling) -> None:
    refused = body.unsupported()
    if refused is not None:
        param, why = refused
        raise OpenAIError(400, why, param, "unsupported_value")


async def generate(s: State, prompt_ids: list[int], body: Sampling, max_tokens: int, param: str) -> Generation:
    engine, tokenizer = s.service.agent.engine, s.service.agent.chat.tokenizer
    temperature = 1.0 if body.temperature is None else body.temperature
    top_p = 1.0 if body.top_p is None else body.top_p
    try:
        gen = await engine.generate(prompt_ids, max_tokens, temperature, top_p, [tokenizer.eos_token_id], body.seed)
    except ValueError as err:  # vLLM refuses a prompt it cannot serve (longer than the model's context, ...)
        raise OpenAIError(400, str(err), param) from None
    except Exception as err:
        log.exception("generation failed")
        dead = " (the engine died; this server is being replaced)" if engine.dead else ""
        raise OpenAIError(503, f"generation failed: {err or type(err).__name__}{dead}") from None
    s.metrics.generated_tokens.inc(len(gen.token_ids))
    return gen


def _head(s: State) -> dict[str, Any]:
    return {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": s.model_name}


def _usage(prompt_ids: list[int], gen: Generation) -> Usage:
    prompt, completion = len(prompt_ids), len(gen.token_ids)
    return Usage(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)


def _stream_usage(body: Sampling, usage: Usage) -> Usage | None:
    return usage if body.stream_options is not None and body.stream_options.include_usage else None


def _event_stream(events: Iterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
