"""The trusted oracle: a task's checks scored without running any test code in the agent's process.

A test file compares results with expected values inside the process that imports the agent's code, so that
code can make any test pass without fixing anything: patch unittest, print a fake summary, return an object
equal to everything, read the expected value from the caller's frame. The oracle moves the comparison out.
A child process (the session's user, `python -I -B`, the workspace after the standard library on `sys.path`)
imports the module, makes each check's call and writes back only the values, as JSON, after a nonce; the
server parses that report and compares the values with the expected ones, which never enter the child. The
agent's code can still print, crash or write a report of its own, but to score it must return the right
values for calls it has not seen the answers to, which is what fixing the bug means.

A report that is missing, repeated, malformed or answers other calls than asked is tampering: the run scores 0
and the reason is reported (`kuberl.api.tampering`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from kuberl.api.environment import CallCheck
from kuberl.api.tampering import TamperingReason
from kuberl_sandbox.execution import CommandResult
from kuberl_sandbox.testrun import Resolution, TestOutcome, isolated_python, split_report

MAX_SHOWN = 300
"""Characters of a value or of the process's own output shown in the observation."""

# Runs in the agent's process: it only makes the calls and reports values. The request (nonce, folder, calls)
# comes in argv; the expected values are never in it. The report goes to fd 1 directly (a module that
# replaces sys.stdout does not swallow it) and is the last line of the output.
CHILD = r"""
import importlib, json, os, sys
nonce, folder, calls = json.loads(sys.argv[1])
sys.path.append(folder)
answers = []
for index, module, function, args in calls:
    try:
        target = importlib.import_module(module)
        for name in function.split("."):
            target = getattr(target, name)
        value = target(*args)
        answers.append([index, "value", json.loads(json.dumps(value))])
    except BaseException as error:
        answers.append([index, "error", (type(error).__name__ + ": " + str(error))[:300]])
for stream in (sys.stdout, sys.stderr):
    try:
        stream.flush()
    except BaseException:
        pass
os.write(1, ("\n" + nonce + json.dumps(answers) + "\n").encode())
"""


@dataclass(frozen=True)
class Answer:
    ok: bool
    """The call returned (True) or raised (False)."""
    value: object
    """What it returned (JSON), or the exception's text."""


@dataclass(frozen=True)
class Report:
    """The child's answers, or why they cannot be trusted."""

    answers: dict[int, Answer]
    tampering: TamperingReason | None
    output: str
    """Everything the process printed but the report line."""


def command(checks: Sequence[CallCheck], folder: str, nonce: str) -> str:
    """The shell command that runs the checks' calls in `folder` and reports their values after `nonce`."""
    calls = [[i, c.module, c.function, c.args] for i, c in enumerate(checks)]
    return isolated_python(CHILD, [nonce, folder, calls])


def read_report(result: CommandResult, nonce: str, count: int) -> Report:
    """The answers of a run of `count` calls, checked: exactly one report, one answer per call."""
    report = split_report(result, nonce)
    output = report.output
    if report.payload is None:
        return Report({}, report.tampering, output)
    try:
        raw = json.loads(report.payload)
        rows = [(int(i), kind, value) for i, kind, value in raw if kind in ("value", "error")]
        if len(rows) != len(raw):
            raise ValueError("unknown kind")
    except (ValueError, TypeError):
        return Report({}, TamperingReason.MALFORMED_REPORT, output)
    indices = [i for i, _, _ in rows]
    if len(set(indices)) != len(indices):
        return Report({}, TamperingReason.DUPLICATE_ANSWERS, output)
    if set(indices) - set(range(count)):
        return Report({}, TamperingReason.EXTRA_ANSWERS, output)
    if set(range(count)) - set(indices):
        return Report({}, TamperingReason.MISSING_ANSWERS, output)
    return Report({i: Answer(kind == "value", value) for i, kind, value in rows}, None, output)


def passes(check: CallCheck, answer: Answer | None) -> bool:
    """Compared here, in the server: the value as parsed from JSON against the expected one."""
    return answer is not None and answer.ok and answer.value == check.expected


def test_results(checks: Sequence[CallCheck], report: Report) -> dict[str, bool]:
    """Per test id: every check of it passed (all fail when the report was not trusted)."""
    results: dict[str, bool] = {}
    for index, check in enumerate(checks):
        ok = report.tampering is None and passes(check, report.answers.get(index))
        results[check.test_id] = results.get(check.test_id, True) and ok
    return results


def outcome(checks: Sequence[CallCheck], result: CommandResult, nonce: str) -> TestOutcome:
    """A visible run's outcome: counts per test id and an observation written by the server."""
    report = read_report(result, nonce, len(checks))
    results = test_results(checks, report)
    return TestOutcome(
        total=len(results),
        passed=sum(results.values()),
        output=render(checks, report, results),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        tampering=report.tampering,
    )


def resolution(
    checks: Sequence[CallCheck], result: CommandResult, nonce: str, fail_to_pass: list[str], pass_to_pass: list[str]
) -> TestOutcome:
    """A submission's outcome: FAIL_TO_PASS and PASS_TO_PASS judged from the checks of their test ids."""
    report = read_report(result, nonce, len(checks))
    results = test_results(checks, report)
    output = render(checks, report, results)

    def part(ids: list[str], text: str) -> TestOutcome:
        return TestOutcome(
            total=len(ids),
            passed=sum(results.get(i, False) for i in ids),
            output=text,
            exit_code=result.exit_code,
            timed_out=result.timed_out,
            tampering=report.tampering,
        )

    return Resolution(part(fail_to_pass, output), part(pass_to_pass, "")).combined()


def render(checks: Sequence[CallCheck], report: Report, results: dict[str, bool]) -> str:
    """What the agent sees, unittest-like: the first failing check of each failing test, then the summary."""
    lines = []
    if report.output:
        lines += [_cut(report.output), ""]
    if report.tampering is not None:
        lines += [f"ERROR: the test report could not be trusted ({report.tampering.value}); every test fails", ""]
    failures = errors = 0
    shown: set[str] = set()
    for index, check in enumerate(checks):
        if results[check.test_id] or check.test_id in shown or report.tampering is not None:
            continue
        shown.add(check.test_id)
        answer = report.answers.get(index)
        call = f"{check.function}({', '.join(_cut(repr(a)) for a in check.args)})"
        if answer is None:
            errors += 1
            lines += [f"ERROR: {check.test_id}", f"{call}: no answer (the process ended first)"]
        elif not answer.ok:
            errors += 1
            lines += [f"ERROR: {check.test_id}", f"{call} raised {_cut(str(answer.value))}"]
        else:
            failures += 1
            message = f" : {check.message}" if check.message else ""
            got = _cut(repr(answer.value))
            # the failing call first, as unittest's traceback shows the assert's line, then the assertion
            lines += [
                f"FAIL: {check.test_id}",
                f"{call} returned {got}, expected {check.expected!r}",
                f"AssertionError: {got} != {check.expected!r}{message}",
            ]
    if report.tampering is not None:
        errors = len(results)
    lines += ["-" * 70, f"Ran {len(results)} tests", ""]
    counts = ", ".join(f"{k}={n}" for k, n in (("failures", failures), ("errors", errors)) if n)
    lines.append(f"FAILED ({counts})" if counts else "OK")
    return "\n".join(lines)


def _cut(text: str) -> str:
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."
