"""A problem statement written from a failing test run, without a model: which behaviour is wrong, the failing
tests by name, and pytest's own error lines (the `E` lines: assertion and exception messages, never the test's
source lines, so the hidden tests' code stays hidden)."""

from __future__ import annotations

import re

from kuberl.swebench.factory.testfiles import test_name

MAX_TESTS_LISTED = 5
MAX_ERROR_LINES = 8
_HEADER = re.compile(r"^_{3,} (.+?) _{3,}$")
_END = re.compile(r"^={3,}")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def failure_details(output: str, node_ids: list[str]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """From pytest's text: the one-line summary message and the `E` lines of each of these tests."""
    summaries: dict[str, str] = {}
    for line in output.splitlines():
        for node in node_ids:
            for word in ("FAILED", "ERROR"):
                prefix = f"{word} {node}"
                if line.startswith(prefix) and node not in summaries:
                    rest = line[len(prefix) :]
                    if rest == "" or rest.startswith(" - "):
                        summaries[node] = _clean(rest[3:])
    heads = {".".join(node.split("::")[1:]): node for node in node_ids}
    errors: dict[str, list[str]] = {}
    current: str | None = None
    for line in output.splitlines():
        if header := _HEADER.match(line):
            current = heads.get(header.group(1))
        elif _END.match(line):
            current = None
        elif current is not None and line.startswith("E") and (line == "E" or line[1:2] == " "):
            errors.setdefault(current, []).append(_clean(line[1:]))
    return summaries, {node: _dedent(lines) for node, lines in errors.items()}


def _clean(text: str) -> str:
    return _ADDRESS.sub("", text.rstrip())


def _dedent(lines: list[str]) -> list[str]:
    kept = [line for line in lines if line.strip()]
    indent = min((len(line) - len(line.lstrip()) for line in kept), default=0)
    return [line[indent:] for line in kept]


def behaviour_of(node_ids: list[str]) -> str:
    """The behaviour the failing tests check, from their names: `test_camelize_with_x` -> "camelize with x"."""
    names: list[str] = []
    for node in node_ids:
        name = test_name(node)
        words = (name.function if name else node.rsplit("::", 1)[-1]).removeprefix("test_").removeprefix("test")
        words = words.replace("_", " ").strip() or "its tests"
        if words not in names:
            names.append(words)
    shown = ", ".join(f"`{n}`" for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def problem_statement(package: str, version: str, failing: list[str], output: str, folder: str = "") -> str:
    """The issue text of an instance: what goes wrong in `package`, as the failing tests show it."""
    text = output.replace(folder.rstrip("/") + "/", "") if folder else output
    summaries, errors = failure_details(text, failing)
    lines = [
        f"{package} {version}: wrong behaviour in {behaviour_of(failing)}",
        "",
        f"Something in `{package}` no longer behaves as intended. These tests fail:",
        "",
    ]
    for node in failing[:MAX_TESTS_LISTED]:
        message = summaries.get(node, "")
        lines.append(f"- `{node}`" + (f": {message}" if message else ""))
    if len(failing) > MAX_TESTS_LISTED:
        lines.append(f"- and {len(failing) - MAX_TESTS_LISTED} more of the same kind")
    first = next((errors[node] for node in failing if errors.get(node)), [])
    if first:
        lines += ["", "The first failure reports:", "", "```", *first[:MAX_ERROR_LINES], "```"]
    lines += [
        "",
        "Fix the library so that these tests pass; the rest of its test suite passes now and must keep passing.",
    ]
    return "\n".join(lines) + "\n"
