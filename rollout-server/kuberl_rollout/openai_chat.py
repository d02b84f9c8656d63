"""A chat request as prompt ids, and the answer's tool call read back from the generated text.

Tools reach the model through its chat template when the template renders them (Qwen, Llama 3.1, Hermes and
most tool-trained models' templates take `tools`); a template that ignores them (the tiny test model's) gets
them the way the built-in agent's system prompt gives them: described in the system message, with the
`<tool_call>{...}</tool_call>` syntax that `kuberl.modeling.tool_calls` parses.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from kuberl.api.environment import ToolCall as Action
from kuberl.api.openai_http import ChatMessage, ChatRequest, FunctionCall, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import OPEN, ParseError, format_tool_call, parse_tool_call
from kuberl_rollout.openai_errors import OpenAIError

TOOL_SYNTAX = f'To call a tool, write {OPEN}{{"name": NAME, "arguments": {{...}}}}</tool_call>.'
_PROBE_TOOL = {"type": "function", "function": {"name": "kuberl_probe", "description": "p", "parameters": {}}}


def prompt_ids(chat: ChatFormat, request: ChatRequest) -> list[int]:
    """The conversation and the assistant header as ids, with the request's tools offered to the model."""
    return list(chat.tokenizer.encode(prompt_text(chat, request), add_special_tokens=False))


def prompt_text(chat: ChatFormat, request: ChatRequest) -> str:
    """The conversation and the assistant header as the chat template renders them (what `prompt_ids` encodes)."""
    tokenizer = chat.tokenizer
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or []]
    native = bool(tools) and template_renders_tools(tokenizer)
    messages = [_template_message(m, native, f"messages[{i}]") for i, m in enumerate(request.messages)]
    try:
        if native:
            return str(tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True))
        shown = _with_tool_prompt(messages, tools) if tools else messages
        return str(tokenizer.apply_chat_template(shown, tokenize=False, add_generation_prompt=True))
    except Exception as err:  # a template raises on what it cannot render (roles out of order, ...)
        raise OpenAIError(400, f"messages cannot be rendered by the model's chat template: {err}", "messages") from None


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template shows `tools` to the model (rendering with and without differs)."""
    messages = [{"role": "user", "content": "x"}]
    try:
        with_tools = tokenizer.apply_chat_template(messages, tools=[_PROBE_TOOL], tokenize=False)
    except Exception:  # a template that cannot take tools at all
        return False
    return bool(with_tools != tokenizer.apply_chat_template(messages, tokenize=False))


def _template_message(message: ChatMessage, native: bool, where: str) -> dict[str, Any]:
    """A message as chat templates read it: content a string, tool calls' arguments objects."""
    rendered = message.model_dump(exclude_none=True, exclude={"content", "tool_calls"})
    rendered["role"] = "system" if message.role == "developer" else message.role
    content = message.text()
    calls = [
        (call, _arguments(call.function, f"{where}.tool_calls[{j}]")) for j, call in enumerate(message.tool_calls or [])
    ]
    if calls and native:
        # the template writes the calls itself: our own answers carry their markup in content too
        content = content.split(OPEN)[0].rstrip()
        rendered["tool_calls"] = [
            {"id": call.id, "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
            for call, arguments in calls
        ]
    elif calls and OPEN not in content:
        content += "".join(format_tool_call(Action(name=c.function.name, arguments=a)) for c, a in calls)
    rendered["content"] = content
    return rendered


def _arguments(function: FunctionCall, where: str) -> dict[str, Any]:
    try:
        arguments = json.loads(function.arguments or "{}")
    except json.JSONDecodeError as err:
        raise OpenAIError(
            400, f"{where}.function.arguments is not JSON: {err.msg}", f"{where}.function.arguments"
        ) from None
    if not isinstance(arguments, dict):
        raise OpenAIError(400, f"{where}.function.arguments must be a JSON object", f"{where}.function.arguments")
    return arguments


def _with_tool_prompt(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools described in the system message (one added when the conversation has none)."""
    listing = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    description = f"{TOOL_SYNTAX} Tools:\n{listing}"
    if messages[0]["role"] == "system":
        first = messages[0] | {"content": f"{messages[0]['content']}\n\n{description}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


def tool_calls(text: str) -> list[ToolCall] | None:
    """The tool call the generated text makes, in OpenAI's shape; None when it makes none."""
    parsed = parse_tool_call(text)
    if isinstance(parsed, ParseError):
        return None
    function = FunctionCall(name=parsed.name, arguments=json.dumps(parsed.arguments, ensure_ascii=False))
    return [ToolCall(id=f"call_{uuid.uuid4().hex[:24]}", function=function)]
