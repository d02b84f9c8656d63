"""The rollout server's OpenAI-compatible API (`/v1/models`, `/v1/completions`, `/v1/chat/completions`):
request and response bodies in OpenAI's format, plus what RL needs recorded.

The clients are OpenAI's own and every framework built on them, so the keys are OpenAI's (snake_case) and
requests ignore the fields this server does not read (clients send many). Answers add `token_ids`,
`policy_versions` (per choice, or per chunk of a stream) and `prompt_token_ids`; log-probs are always the
sampled tokens'. A request asking for what the engine cannot do is named by its `unsupported()` and refused
with an `ErrorResponse` (400), never silently answered with something else.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer

MAX_TOKENS = 65536


class OpenAIRequest(BaseModel):
    """Fields this server does not read are ignored: OpenAI clients send many (user, metadata, store, ...)."""

    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIRequest):
    include_usage: bool = False
    """A last chunk with the usage counts (and no choices)."""


class Sampling(OpenAIRequest):
    """What completions and chat completions share."""

    model: str | None = None
    """Any name: a rollout server serves one model (the one `/v1/models` lists)."""
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    temperature: float | None = Field(None, ge=0.0, le=10.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(param, why) of the first field set to something the engine cannot do; None when all can be honoured."""
        if self.n not in (None, 1):
            return "n", "n must be 1: one choice per request (send several requests, each with its own seed)"
        if self.stop:
            return "stop", "stop sequences are not supported: generation ends at the model's end-of-message token"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                return name, f"{name} is not supported: tokens are sampled from the policy as it is"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported: tokens are sampled from the policy as it is"
        return None


# ------------------------------------------------------------------------------------------ completions
class CompletionRequest(Sampling):
    """`POST /v1/completions`: a prompt as text or as token ids."""

    prompt: str | list[int]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.logprobs:
            return "logprobs", "top alternatives are not supported: the sampled tokens' log-probs are always returned"
        if self.echo:
            return "echo", "echo is not supported: the prompt's ids are returned in prompt_token_ids"
        if self.suffix:
            return "suffix", "suffix (insertion) is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "best_of must be 1"
        return super().unsupported()


# ------------------------------------------------------------------------------------------------ chat
class ContentPart(BaseModel):
    """A part of a message's content; only text parts can be rendered for a text model."""

    model_config = ConfigDict(extra="allow")

    type: str
    text: str | None = None


class FunctionCall(OpenAIRequest):
    name: str = Field(min_length=1)
    arguments: str
    """A JSON object, as text."""


class MessageToolCall(OpenAIRequest):
    """A tool call of an earlier assistant message, as the client sends it back."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """A message of the conversation; fields other than these are passed on to the chat template."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if isinstance(self.content, list):
            return "".join(part.text or "" for part in self.content)
        return self.content or ""


class FunctionDefinition(OpenAIRequest):
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments."""
    strict: bool | None = None


class FunctionTool(OpenAIRequest):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(OpenAIRequest):
    name: str


class NamedToolChoice(OpenAIRequest):
    type: Literal["function"]
    function: NamedFunction


class ChatRequest(Sampling):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)
    """OpenAI's newer name for max_tokens; wins when both are given."""
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if isinstance(self.tool_choice, NamedToolChoice) or self.tool_choice == "required":
            return "tool_choice", (
                "tool_choice can be 'auto' or 'none': the model decides itself whether to call a tool, "
                "nothing forces a call (no constrained decoding)"
            )
        if self.top_logprobs:
            return "top_logprobs", "top alternatives are not supported: the sampled tokens' log-probs are returned"
        if self.response_format and self.response_format.get("type") != "text":
            return "response_format", "only response_format {'type': 'text'} is supported (no constrained decoding)"
        for i, message in enumerate(self.messages):
            for part in message.content if isinstance(message.content, list) else []:
                if part.type != "text":
                    return f"messages[{i}].content", f"content parts of type {part.type!r} are not supported, only text"
        return super().unsupported()


# ---------------------------------------------------------------------------------------------- answers
class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "kuberl"
    policy_version: int
    """The policy version the engine samples with now (ours; advances with every weight update)."""


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: None = None
    text_offset: None = None


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs
    finish_reason: str | None
    token_ids: list[int]
    """The ids sampled (ours)."""
    policy_versions: list[int]
    """The policy version that sampled each id (ours)."""


class Completion(BaseModel):
    """`POST /v1/completions`; with `stream`, every chunk is one of these with the text and ids it adds."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None
    """The prompt as the engine saw it (ours; on the first chunk of a stream)."""


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None
    top_logprobs: list[Any] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob]


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    """The generated text as it is, a tool call's markup included: sent back, it renders to the same tokens."""
    tool_calls: list[ToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: ChatLogprobs
    finish_reason: str | None
    token_ids: list[int]
    policy_versions: list[int]


class ChatCompletion(BaseModel):
    """`POST /v1/chat/completions`."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int]


class ToolCallDelta(BaseModel):
    index: int = 0
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Delta(BaseModel):
    """What a chunk adds to the message; fields it does not add are left out."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _set_fields_only(self, handler: Any) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] = []
    policy_versions: list[int] = []


class ChatCompletionChunk(BaseModel):
    """One server-sent event of a streamed chat completion."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


# ----------------------------------------------------------------------------------------------- errors
class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every 4xx and 5xx answer of these endpoints (OpenAI's shape: clients raise with `message`)."""

    error: ErrorDetail
