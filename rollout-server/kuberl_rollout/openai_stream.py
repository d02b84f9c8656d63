"""Streamed answers as server-sent events (`data: {chunk}` ... `data: [DONE]`), in OpenAI's chunk shapes.

The engine hands back a whole generation at once (one token-in/token-out call), so a stream is cut from the
finished generation: one chunk per token with its text, id, sampling log-prob and policy version. A client
that records a stream gets exactly the ids and log-probs of the non-streaming answer, and the texts of the
chunks join to its text. Errors are all known before the first byte is sent, so they are answered in full.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kuberl.api.openai_http import (
    ChatCompletionChunk,
    ChatLogprobs,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    Delta,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from kuberl_rollout.engine import Generation

_INCOMPLETE = "\ufffd"  # what decoding yields for the first bytes of a character split across tokens


def text_pieces(tokenizer: Any, ids: list[int]) -> list[str]:
    """The text each token adds; joined, they equal decoding all of `ids` (special tokens skipped). A token
    ending inside a multi-byte character adds '', and the character comes with the token that completes it."""
    full = tokenizer.decode(ids, skip_special_tokens=True)
    pieces: list[str] = []
    start = done = 0  # ids[start:done] were decoded before: the context the next token's text is cut from
    for i in range(len(ids)):
        before = tokenizer.decode(ids[start:done], skip_special_tokens=True)
        after = tokenizer.decode(ids[start : i + 1], skip_special_tokens=True)
        held = i + 1 - done  # a character spans at most 4 tokens (bytes): beyond, undecodable bytes are final
        if after.startswith(before) and (not after.endswith(_INCOMPLETE) or held >= 4):
            pieces.append(after[len(before) :])
            start, done = done, i + 1
        elif held >= 4:  # a tokenizer whose text depends on more context than a character's tokens
            return _all_at_the_end(ids, full)
        else:
            pieces.append("")
    joined = "".join(pieces)
    if not full.startswith(joined):
        return _all_at_the_end(ids, full)
    if pieces:
        pieces[-1] += full[len(joined) :]  # a last character that never completed
    return pieces


def _all_at_the_end(ids: list[int], full: str) -> list[str]:
    return [""] * (len(ids) - 1) + [full] if ids else []


def sse(chunks: Iterator[ChatCompletionChunk] | Iterator[Completion], prompt_ids: list[int]) -> Iterator[str]:
    """Server-sent events, the first chunk carrying the prompt's ids, the last event OpenAI's `[DONE]`."""
    for i, chunk in enumerate(chunks):
        if i == 0:
            chunk.prompt_token_ids = prompt_ids
        yield f"data: {chunk.model_dump_json()}\n\n"
    yield "data: [DONE]\n\n"


def chat_chunks(
    head: dict[str, Any],
    tokenizer: Any,
    gen: Generation,
    calls: list[ToolCall] | None,
    finish_reason: str | None,
    usage: Usage | None,
) -> Iterator[ChatCompletionChunk]:
    """The chunks of a chat completion: the role, one per token, the tool call, the finish reason, the usage."""
    yield ChatCompletionChunk(**head, choices=[ChunkChoice(delta=Delta(role="assistant", content=""))])
    for token, piece, logprob, version in _tokens(tokenizer, gen):
        logprobs = ChatLogprobs(content=[TokenLogprob(token=tokenizer.decode([token]), logprob=logprob)])
        choice = ChunkChoice(
            delta=Delta(content=piece), logprobs=logprobs, token_ids=[token], policy_versions=[version]
        )
        yield ChatCompletionChunk(**head, choices=[choice])
    if calls:
        deltas = [ToolCallDelta(index=i, id=c.id, function=c.function) for i, c in enumerate(calls)]
        yield ChatCompletionChunk(**head, choices=[ChunkChoice(delta=Delta(tool_calls=deltas))])
    yield ChatCompletionChunk(**head, choices=[ChunkChoice(delta=Delta(), finish_reason=finish_reason)])
    if usage is not None:
        yield ChatCompletionChunk(**head, choices=[], usage=usage)


def completion_chunks(
    head: dict[str, Any], tokenizer: Any, gen: Generation, usage: Usage | None
) -> Iterator[Completion]:
    """The chunks of a completion: one per token, the finish reason, the usage."""
    for token, piece, logprob, version in _tokens(tokenizer, gen):
        logprobs = CompletionLogprobs(tokens=[tokenizer.decode([token])], token_logprobs=[logprob])
        choice = CompletionChoice(
            text=piece, logprobs=logprobs, finish_reason=None, token_ids=[token], policy_versions=[version]
        )
        yield Completion(**head, choices=[choice])
    last = CompletionLogprobs(tokens=[], token_logprobs=[])
    finish = CompletionChoice(text="", logprobs=last, finish_reason=gen.finish_reason, token_ids=[], policy_versions=[])
    yield Completion(**head, choices=[finish])
    if usage is not None:
        yield Completion(**head, choices=[], usage=usage)


def _tokens(tokenizer: Any, gen: Generation) -> Iterator[tuple[int, str, float, int]]:
    pieces = text_pieces(tokenizer, gen.token_ids)
    yield from zip(gen.token_ids, pieces, gen.logprobs, gen.versions, strict=True)
