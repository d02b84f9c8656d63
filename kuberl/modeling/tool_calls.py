"""How an agent writes a tool call in text, and how the rollout tier reads it back.

The syntax is the common Hermes/Qwen one: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.
Only the generated *text* is parsed; the generated token ids are kept as they are (never re-encoded).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from pydantic import ValidationError

from kuberl.api.environment import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)


def system_prompt(intro: str, tools: list[str], advice: str) -> str:
    """An agent's system prompt: what it does, how it writes a tool call, its tools (as `name(arg, ...)`), advice."""
    return (
        f'{intro} Each turn, call exactly one tool as {OPEN}{{"name": NAME, "arguments": {{...}}}}{CLOSE}. '
        f"Tools: {', '.join(tools)}. {advice}"
    )


SWE_SYSTEM_PROMPT = system_prompt(
    "You fix bugs in small Python repositories.",
    ["read_file(path)", "replace(path, old, new)", "run_tests()", "submit()"],
    "Read the failing test, fix the code, run the tests, submit.",
)

REPOSITORY_SYSTEM_PROMPT = system_prompt(
    "You resolve issues in real Python repositories.",
    [
        "list_files(path)",
        "search(text, path)",
        "read_file(path, start, end)",
        "replace(path, old, new)",
        "run(command)",
        "run_tests()",
        "submit()",
    ],
    "Find the code the issue is about, read it by line ranges, fix it, run the tests, submit.",
)
"""The built-in agent's prompt for tasks on repositories (environment `swe-bench`): files too large to read whole."""


@dataclass(frozen=True)
class ParseError:
    """Why generated text held no usable tool call; shown to the agent as its observation."""

    message: str


def format_tool_call(call: ToolCall) -> str:
    """The text of a tool call, as demonstrations write it and the parser reads it."""
    return OPEN + json.dumps({"name": call.name, "arguments": call.arguments}, ensure_ascii=False) + CLOSE


def parse_tool_call(text: str) -> ToolCall | ParseError:
    """The first tool call in `text`, or what was wrong with it."""
    match = _CALL.search(text)
    if match is None:
        return ParseError(f'error: no tool call found; write {OPEN}{{"name": ..., "arguments": {{...}}}}{CLOSE}')
    try:
        payload = json.loads(match.group(1))
    except json.JSONDecodeError as err:
        return ParseError(f"error: the tool call is not valid JSON ({err.msg} at character {err.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ParseError('error: the tool call needs a "name" string and an "arguments" object')
    try:
        return ToolCall(name=payload["name"], arguments=payload.get("arguments") or {})
    except ValidationError as err:
        return ParseError(f"error: bad tool call: {err.errors()[0]['msg']}")
