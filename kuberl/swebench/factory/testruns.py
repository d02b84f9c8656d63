"""One run of a package's tests in a folder, with `kuberl.swebench.pytest_report`'s runner: per-test outcomes
from the report line, and pytest's own text (its `-rA` summary and failure sections) for the messages."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kuberl.swebench import pytest_report


@dataclass(frozen=True)
class TestRun:
    """What one pytest run gave: outcomes by node id (empty when it timed out or printed no report)."""

    outcomes: dict[str, str] = field(default_factory=dict)
    output: str = ""
    seconds: float = 0.0
    timed_out: bool = False
    exit_code: int | None = None

    def passing(self) -> set[str]:
        return {node for node in self.outcomes if pytest_report.passed(self.outcomes, node)}

    @property
    def reported(self) -> bool:
        return not self.timed_out and self.exit_code is not None


def run_tests(folder: Path, files: list[str], python: Path, paths: list[str], timeout_s: float) -> TestRun:
    """Run pytest on `files` (relative to `folder`) with the environment's python; killed after `timeout_s`."""
    nonce = f"kuberl-factory-{secrets.token_hex(12)}:"
    command = pytest_report.command(str(folder), files, nonce, paths, str(python))
    # A wide terminal keeps pytest's one-line failure summaries whole.
    env = {**os.environ, "COLUMNS": "200"}
    started = time.monotonic()
    process = subprocess.Popen(
        ["/bin/sh", "-c", command],
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # a bug that hangs a test, or forks, is killed with its whole group
    )
    try:
        stdout, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return TestRun(seconds=time.monotonic() - started, timed_out=True)
    seconds = time.monotonic() - started
    text = stdout.decode(errors="replace")
    lines = text.splitlines()
    reports = [line for line in lines if line.startswith(nonce)]
    if len(reports) != 1:
        return TestRun(output=text, seconds=seconds)
    try:
        code, outcomes = pytest_report.parse(reports[0][len(nonce) :])
    except ValueError:
        return TestRun(output=text, seconds=seconds)
    output = "\n".join(line for line in lines if not line.startswith(nonce))
    return TestRun(outcomes=outcomes, output=output, seconds=seconds, exit_code=code)
