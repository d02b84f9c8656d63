"""Pytest runs whose per-test outcomes come from a report, not from what the tests print.

The runner is a pytest plugin in the test process: it records each node id's outcome from pytest's own
reports and, after pytest returns, writes one line: a per-run nonce followed by the outcomes as JSON. Text
the code under test prints (a forged `PASSED tests/test_x.py::test_y`, say) is only output; a report line
needs the nonce, which that code does not know before it runs, and two report lines are refused as
tampering by the reader (`kuberl_sandbox.testrun.split_report`). The workspace's folders come on `sys.path`
after the standard library and before site-packages, so the code under test is the workspace's, never an
installed copy, and cannot shadow the standard library.
"""

from __future__ import annotations

import json
import shlex

PASSING = frozenset({"passed", "xfail"})
"""Outcomes SWE-bench's grading counts as a pass (an expected failure included); `skipped` is not one."""

RUNNER = r"""
import json, os, sys
nonce, folder, paths, files = json.loads(sys.argv[1])
site = next((i for i, p in enumerate(sys.path) if p.endswith(("site-packages", "dist-packages"))), len(sys.path))
sys.path[site:site] = [os.path.join(folder, p) if p != "." else folder for p in paths]
os.chdir(folder)
import pytest

outcomes = {}


class Recorder:
    def pytest_runtest_logreport(self, report):
        node, seen = report.nodeid, outcomes.get(report.nodeid)
        if getattr(report, "wasxfail", None) is not None and report.when == "call":
            outcomes[node] = "xfail" if report.skipped else "failed"
        elif report.failed:
            outcomes[node] = "failed" if report.when == "call" else "error"
        elif report.skipped and seen is None:
            outcomes[node] = "skipped"
        elif report.passed and report.when == "call" and seen is None:
            outcomes[node] = "passed"

    def pytest_collectreport(self, report):
        if report.failed:
            outcomes[report.nodeid] = "error"


args = ["-p", "no:cacheprovider", "-q", "--tb=short", "-rfE", "--rootdir", folder, *files]
code = pytest.main(args, plugins=[Recorder()])
os.write(1, ("\n" + nonce + json.dumps({"exitCode": int(code), "outcomes": outcomes}) + "\n").encode())
sys.exit(int(code))
"""


def command(folder: str, files: list[str], nonce: str, paths: list[str] | None = None, python: str = "python") -> str:
    """The shell command that runs pytest on `files` in `folder` (its `paths`, relative, put on sys.path)."""
    request = json.dumps([nonce, folder, paths or ["."], files])
    return f"{shlex.quote(python)} -I -B -c {shlex.quote(RUNNER)} {shlex.quote(request)}"


def parse(payload: str) -> tuple[int | None, dict[str, str]]:
    """The exit code and the node id -> outcome map of a report; ValueError when it is not one."""
    report = json.loads(payload)
    outcomes = report.get("outcomes") if isinstance(report, dict) else None
    if not isinstance(outcomes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in outcomes.items()
    ):
        raise ValueError("not a pytest report")
    code = report.get("exitCode")
    return (code if isinstance(code, int) else None), outcomes


def passed(outcomes: dict[str, str], node_id: str) -> bool:
    """Whether `node_id` passed (a test that did not run, was skipped or errored did not)."""
    return outcomes.get(node_id) in PASSING


def source_paths(files: list[str]) -> list[str]:
    """The workspace folders code is imported from: the root, and `src` for a src-layout repository."""
    return ["."] + (["src"] if any(f.startswith("src/") for f in files) else [])
