"""Recorded sessions (`/v1/sessions`): open one, point any OpenAI client at its base URL, close it with a reward.

Bodies are `kuberl.api.sessions_http` (the session API) and `kuberl.api.openai_http` (the calls); every error
is answered in OpenAI's shape, so an OpenAI client raises with the message: 401 without the right key, 404 for
an unknown session, 409 for a call to (or a second close of) a closed one. Nothing of a refused call is recorded.

Opening a session asks for the job token; the answer carries the session's own API key, which opens that
session's routes (and no other's): give it to the OpenAI client as its `api_key`. The job token opens them too.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from kuberl.api.openai_http import ChatCompletion, ChatRequest, ErrorResponse, ModelCard, ModelList
from kuberl.api.sessions_http import ClosedSession, CloseSession, OpenedSession, OpenSession, SessionInfo
from kuberl.api.trajectory import FinishReason
from kuberl_rollout import openai_chat
from kuberl_rollout.auth import JOB_TOKEN, SESSION_KEY
from kuberl_rollout.openai_errors import OpenAIError, OpenAIRoute
from kuberl_rollout.openai_routes import card, chat_answer, chat_max_tokens, generate, refuse_unsupported
from kuberl_rollout.state import State

router = APIRouter(
    prefix="/v1/sessions",
    tags=["sessions"],
    route_class=OpenAIRoute,
    responses={code: {"model": ErrorResponse} for code in (400, 401, 404, 409, 503)},
)


@router.post("", status_code=201, dependencies=JOB_TOKEN)
async def open_session(body: OpenSession, request: Request, s: State) -> OpenedSession:
    task = body.task
    if body.task_id is not None:
        if body.task is not None:
            raise OpenAIError(400, "give taskId or task, not both", "taskId")
        task = s.service.tasks.get(body.task_id)
        if task is None:
            raise OpenAIError(404, f"unknown task {body.task_id!r}", "taskId", "task_not_found")
    session = s.service.sessions.open(str(request.base_url), task, body.group_id)
    return OpenedSession(**session.describe().model_dump(), api_key=session.api_key)


@router.get("/{session_id}", dependencies=SESSION_KEY)
async def describe(session_id: str, s: State) -> SessionInfo:
    return s.service.sessions.describe(session_id)


@router.post("/{session_id}/close", dependencies=SESSION_KEY)
async def close(session_id: str, body: CloseSession, s: State) -> ClosedSession:
    store = s.service.sessions
    session = store.get(session_id)
    async with session.lock:  # after a call in flight is recorded
        if session.closed:  # closed while this request waited for the lock
            store.get(session_id)
        if body.reward is None and not session.episode:
            raise OpenAIError(400, "reward is required: this session belongs to no episode to score", "reward")
        session.reward = body.reward
        info = store.close(session)
        task_prompt = session.task.prompt if session.task is not None else ""  # for a session without calls
        fallback = s.service.agent.chat.prompt_ids([{"role": "user", "content": task_prompt}])
        # an episode's trajectory is delivered (and scored, without a reward) when its agent returns
        trajectory = session.trajectory(body.reward or 0.0, FinishReason.SUBMITTED, fallback)
    return ClosedSession(session=info, trajectory=trajectory)


@router.get("/{session_id}/openai/v1/models", dependencies=SESSION_KEY)
async def models(session_id: str, s: State) -> ModelList:
    s.service.sessions.get(session_id)
    return ModelList(data=[card(s)])


@router.get("/{session_id}/openai/v1/models/{model_id:path}", dependencies=SESSION_KEY)
async def model(session_id: str, model_id: str, s: State) -> ModelCard:
    s.service.sessions.get(session_id)
    if model_id != s.model_name:
        raise OpenAIError(404, f"The model {model_id!r} does not exist; this server serves {s.model_name!r}", "model")
    return card(s)


@router.post(
    "/{session_id}/openai/v1/chat/completions",
    response_model=None,
    responses={200: {"model": ChatCompletion}},
    dependencies=SESSION_KEY,
)
async def chat_completions(session_id: str, body: ChatRequest, s: State) -> ChatCompletion | StreamingResponse:
    session = s.service.sessions.get(session_id)
    refuse_unsupported(body)
    text = openai_chat.prompt_text(s.service.agent.chat, body)
    async with session.lock:
        s.service.sessions.get(session_id)  # closed while this call waited
        started = time.perf_counter()
        prompt = session.prompt(text)
        mismatch = prompt.new_segment and bool(session.segments)
        max_tokens = chat_max_tokens(body, len(prompt.ids), s.context_tokens)
        budget = session.budget(prompt)
        if budget is not None and budget <= 0:
            raise OpenAIError(
                400, "the episode's token budget is spent (environment.maxTokensPerTrajectory)", "messages"
            )
        gen = await generate(s, prompt.ids, body, max_tokens if budget is None else min(max_tokens, budget), "messages")
        seconds = time.perf_counter() - started
        session.record(prompt, gen, seconds)
    m = s.metrics
    m.turn_seconds.labels("generate").observe(seconds)
    m.session_calls.inc()
    m.session_history_mismatches.inc(mismatch)
    m.session_prompt_tokens.labels("reused").inc(prompt.reused)
    m.session_prompt_tokens.labels("encoded").inc(len(prompt.ids) - prompt.reused)
    return chat_answer(s, body, prompt.ids, gen)


@router.post("/{session_id}/openai/v1/completions", include_in_schema=False, dependencies=SESSION_KEY)
async def completions(session_id: str) -> None:
    raise OpenAIError(
        404,
        "sessions record chat completions only; use /chat/completions (or /v1/completions, unrecorded)",
        code="unsupported",
    )
