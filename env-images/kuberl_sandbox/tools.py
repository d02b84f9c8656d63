"""The tools an agent calls, applied to a session: the sandbox side of the environment protocol.

A tool call never fails the request: a malformed or impossible call returns an observation that says
what went wrong, so the agent can read it and try again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kuberl.api.environment import StepResult, ToolCall
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.session_manager import Session, SessionManager

ToolHandler = Callable[[SessionManager, Session, dict[str, Any]], Awaitable[StepResult]]


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters cut]"


def _args(arguments: dict[str, Any], *names: str) -> list[str]:
    missing = [n for n in names if not isinstance(arguments.get(n), str)]
    if missing:
        raise ws.WorkspaceError(f"missing or non-string argument(s): {', '.join(missing)}")
    return [arguments[n] for n in names]


MAX_SEARCH_MATCHES = 50
MAX_LISTED_SHOWN = 300


def _line_number(arguments: dict[str, Any], name: str) -> int | None:
    value = arguments.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ws.WorkspaceError(f"{name} must be a line number (1 or more), got {value!r}")
    return value


async def read_file(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    """The file, or with `start` / `end` (line numbers, 1-based, inclusive) those lines, numbered; cut at the
    observation limit either way."""
    (path,) = _args(arguments, "path")
    start, end = _line_number(arguments, "start"), _line_number(arguments, "end")
    limit = manager.settings.observation_bytes
    if start is None and end is None:
        content, cut = await manager.read_file(session, path, limit)
        return StepResult(observation=content + ("\n... [file cut]" if cut else ""), info={"path": path})
    content, _ = await manager.read_file(session, path, manager.settings.limits.max_file_bytes)
    lines = content.split("\n")
    first, last = start or 1, min(end or len(lines), len(lines))
    shown = "\n".join(f"{n:>5}  {lines[n - 1]}" for n in range(first, last + 1))
    footer = f"\n[lines {first}-{last} of {len(lines)}]" if first <= last else f"[{path} has {len(lines)} lines]"
    return StepResult(observation=_cut(shown, limit) + footer, info={"path": path, "lines": len(lines)})


async def search(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    """Lines that contain `text` (plain text) in the files under `path` (default: the whole workspace)."""
    (text,) = _args(arguments, "text")
    path = arguments.get("path") or "."
    if not isinstance(path, str):
        raise ws.WorkspaceError("path must be a string")
    matches, more = await manager.search(session, text, path, MAX_SEARCH_MATCHES)
    lines = [f"{file}:{number}: {line.strip()}" for file, number, line in matches]
    tail = f"\n[first {len(matches)} matches shown; narrow the path]" if more else f"\n[{len(matches)} matches]"
    observation = _cut("\n".join(lines), manager.settings.observation_bytes) + tail
    return StepResult(observation=observation, info={"matches": len(matches), "more": more})


async def replace(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    path, old, new = _args(arguments, "path", "old", "new")
    count = await manager.replace(session, path, old, new)
    return StepResult(observation=f"Replaced {count} occurrence(s) in {path}.", info={"replaced": count})


async def write_file(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    path, content = _args(arguments, "path", "content")
    size = await manager.write_file(session, path, content)
    return StepResult(observation=f"Wrote {size} bytes to {path}.", info={"bytes": size})


async def list_files(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    path = arguments.get("path") or "."
    if not isinstance(path, str):
        raise ws.WorkspaceError("path must be a string")
    entries = await manager.list_files(session, path)
    shown = [str(e["path"]) + ("/" if e["type"] == "dir" else "") for e in entries[:MAX_LISTED_SHOWN]]
    if len(entries) > MAX_LISTED_SHOWN:
        shown.append(f"[{len(entries) - MAX_LISTED_SHOWN} more entries; list a folder]")
    observation = _cut("\n".join(shown), manager.settings.observation_bytes)
    return StepResult(observation=observation, info={"entries": len(entries)})


async def run(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    (command,) = _args(arguments, "command")
    result = await manager.execute(session, command)
    status = "timed out" if result.timed_out else f"exit code {result.exit_code}"
    observation = _cut(result.output, manager.settings.observation_bytes) + f"\n[{status}]"
    return StepResult(observation=observation, info={"exitCode": result.exit_code, "timedOut": result.timed_out})


async def run_tests(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    outcome = await manager.run_tests(session)
    observation = _cut(outcome.output.strip(), manager.settings.observation_bytes)
    observation += f"\n[{outcome.passed}/{outcome.total} tests passed]"
    return StepResult(observation=observation, info={"tests": outcome.as_info()})


async def submit(manager: SessionManager, session: Session, arguments: dict[str, Any]) -> StepResult:
    outcome = await manager.run_tests(session, hidden=True)
    manager.record(session, {"op": "submit"})
    return StepResult(
        observation=f"Submitted. {outcome.passed}/{outcome.total} hidden tests passed.",
        done=True,
        info={"hiddenTests": outcome.as_info()},
    )


TOOLS: dict[str, ToolHandler] = {
    "read_file": read_file,
    "replace": replace,
    "write_file": write_file,
    "list_files": list_files,
    "search": search,
    "run": run,
    "run_tests": run_tests,
    "submit": submit,
}


async def apply_tool(manager: SessionManager, session: Session, call: ToolCall) -> StepResult:
    """Apply one tool call; errors become observations with info['error'] set."""
    handler = TOOLS.get(call.name)
    if handler is None:
        known = ", ".join(TOOLS)
        return StepResult(
            observation=f"error: unknown tool {call.name!r}; tools: {known}", info={"error": "unknown_tool"}
        )
    try:
        return await handler(manager, session, call.arguments)
    except ws.WorkspaceError as err:
        return StepResult(observation=f"error: {err}", info={"error": "bad_arguments"})
