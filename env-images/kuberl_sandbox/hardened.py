"""Hardened unittest runs: for tasks without an oracle, whose tests must run inside the agent's process.

What this path removes: everything that lets the *workspace* decide what runs before or instead of the
tests. The tests run in a scratch copy whose test files are the task's pristine copies, cleaned of links,
bytecode caches, `.pth` files, `sitecustomize`/`usercustomize`, and modules named like the standard library
or the test modules; Python starts isolated (`-I`: no user site, no PYTHON* variables, the script's folder not on
`sys.path`) with the workspace appended *after* the standard library; the result is a JSON report after a
nonce, written by the runner, checked against the expected test ids (a printed "OK" counts for nothing).

What it cannot remove: code that the tests import runs in the same process as the runner, so it can still
patch unittest, return objects equal to everything, read the expected value from the caller's frame, or
print a report of its own. That is why RL tasks should come with an oracle (oracle.py), where the expected
values never enter the agent's process. docs/rewards.md says the same to users.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
from collections.abc import Iterable
from pathlib import Path

from kuberl.api.tampering import TamperingReason
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.execution import CommandResult
from kuberl_sandbox.testrun import TestOutcome, isolated_python, split_report

STARTUP_FILES = {b"sitecustomize.py", b"usercustomize.py"}
_TIMING = re.compile(r"^(Ran \d+ tests?) in \d+(\.\d+)?s$", re.MULTILINE)

RUNNER = r"""
import json, os, sys, unittest
nonce, folder, names = json.loads(sys.argv[1])
sys.path.append(folder)
results = {}


class Recorder(unittest.TextTestResult):
    def _record(self, test, outcome):
        results[test.id()] = outcome

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "fail")

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "error")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._record(test, "skip")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "fail")


suite = unittest.defaultTestLoader.loadTestsFromNames(names)
unittest.TextTestRunner(stream=sys.stderr, verbosity=1, resultclass=Recorder).run(suite)
os.write(1, ("\n" + nonce + json.dumps(results) + "\n").encode())
"""


def clean(scratch: Path, test_modules: Iterable[str], task_modules: Iterable[str]) -> list[str]:
    """Remove from the scratch copy what could run before or instead of the tests: bytecode, `.pth` and
    start-up files, and top-level modules named like the standard library (but the task's own) or like a
    test module (the pristine copies are written afterwards); returns what was removed. Runs with the
    session's file rights (the caller's)."""
    stdlib = {name.encode() for name in sys.stdlib_module_names} - {m.encode() for m in task_modules}
    shadowed = stdlib | {m.split(".")[0].encode() for m in test_modules}
    removed: list[str] = []
    with ws.open_folder(scratch, [], ".") as folder:
        doomed = [e for e in ws.walk(folder) if _doomed(e, shadowed)]
    for entry in reversed(doomed):  # deepest first
        _remove(scratch, entry.path, entry.kind)
        removed.append(ws.shown_name(entry.path))
    return removed


def _doomed(entry: ws.Entry, shadowed: set[bytes]) -> bool:
    """Links of any kind go (a link can bring a package, or a `__pycache__` of the live workspace, in under
    a pristine name); so does anything, of any kind, named like a shadowed module or a cache."""
    name, top = entry.name, b"/" not in entry.path
    stem = name.rsplit(b".", 1)[0] if name.endswith((b".py", b".pyc", b".so")) else name
    return (
        entry.kind == "link"
        or name == b"__pycache__"
        or name.endswith((b".pyc", b".pth", b".so"))
        or name in STARTUP_FILES
        or (top and stem in shadowed)
    )


def _remove(scratch: Path, path: bytes, kind: str) -> None:
    names = ws.path_names(path)
    with ws.open_folder(scratch, names[:-1], path) as parent:
        if kind == "dir":
            remove_tree(parent, names[-1])
        else:
            os.unlink(names[-1], dir_fd=parent)


def remove_tree(parent: int, name: bytes) -> None:
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=parent)
    try:
        for child in os.listdir(fd):
            info = os.stat(child, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                remove_tree(fd, os.fsencode(child))
            else:
                os.unlink(child, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)


def command(names: list[str], folder: str, nonce: str) -> str:
    """The shell command that runs the unittest `names` (modules or test ids) in `folder`."""
    return isolated_python(RUNNER, [nonce, folder, names])


def outcome(result: CommandResult, nonce: str, expected_ids: list[str] | None, expected_total: int) -> TestOutcome:
    """Passes counted from the runner's report: of `expected_ids` when given, else of every test it ran
    (at most `expected_total`, the pristine files' test methods)."""
    report = split_report(result, nonce)
    text = _TIMING.sub(r"\1", report.output)  # without timings, the same workspace gives the same observation
    tampering, results = report.tampering, {}
    if report.payload is not None:
        try:
            results = json.loads(report.payload)
            if not isinstance(results, dict) or not all(isinstance(v, str) for v in results.values()):
                raise ValueError("not a map of outcomes")
        except ValueError:
            tampering, results = TamperingReason.MALFORMED_REPORT, {}
    if tampering is not None:
        results = {}
    if expected_ids is not None:
        total, passed = len(expected_ids), sum(results.get(i) == "pass" for i in expected_ids)
    else:
        total = max(expected_total, len(results))
        passed = min(sum(v == "pass" for v in results.values()), expected_total)
    if tampering is not None:
        text += f"\nERROR: the test report could not be trusted ({tampering.value}); every test fails"
    return TestOutcome(
        total=total,
        passed=passed,
        output=text,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        tampering=tampering,
    )
