"""OpenAI-compatible endpoints (`/v1/completions`, `/v1/chat/completions`), in OpenAI's format plus what RL
needs recorded: token ids, prompt token ids, policy versions and per-token log-probs."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from kuberl.modeling.tool_calls import ParseError, parse_tool_call
from kuberl_rollout.service import WorkError
from kuberl_rollout.state import State

router = APIRouter(prefix="/v1", tags=["openai"])


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


@router.post("/completions")
async def completions(body: CompletionRequest, s: State) -> dict[str, Any]:
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


@router.post("/chat/completions")
async def chat_completions(body: ChatRequest, s: State) -> dict[str, Any]:
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
