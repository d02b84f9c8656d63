"""The SWE-bench check of a made instance, without a sandbox: in a copy of `base_commit`, with `test_patch`
applied its FAIL_TO_PASS tests fail and its PASS_TO_PASS tests pass; with `patch` applied too, all pass and
the files are the pristine ones again."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from kuberl.api.swebench import SWEBenchInstance, test_file_of
from kuberl.swebench import pytest_report
from kuberl.swebench.factory import repository
from kuberl.swebench.factory.testruns import TestRun

_DIFF_FILE = re.compile(r"^diff --git a/(\S+) b/", re.MULTILINE)


def apply_patch(folder: Path, patch: str) -> None:
    """Apply a git-format diff to a plain folder (no repository: git acts as `patch`)."""
    # The ceiling keeps git from taking a repository above the folder as the one to patch.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(folder.parent), "GIT_CONFIG_NOSYSTEM": "1"}
    done = subprocess.run(
        ["git", "apply", "--whitespace=nowarn", "-"], cwd=folder, input=patch.encode(), capture_output=True, env=env
    )
    if done.returncode != 0:
        raise ValueError(f"git apply: {done.stderr.decode(errors='replace').strip()}")


def check(
    repo: Path, instance: SWEBenchInstance, folder: Path, run: Callable[[Path, list[str]], TestRun]
) -> str | None:
    """None when the instance holds up; else why not, in a few words. `run(folder, files)` runs tests."""
    pristine = instance.environment_commit
    test_files = sorted({f for t in [*instance.fail_to_pass, *instance.pass_to_pass] if (f := test_file_of(t))})
    repository.export(repo, instance.base_commit, folder)
    try:
        apply_patch(folder, instance.test_patch)
    except ValueError as error:
        return f"test_patch does not apply: {error}"
    before = run(folder, test_files)
    if before.timed_out or not before.outcomes:
        return "no test report before the fix"
    if passing := [t for t in instance.fail_to_pass if pytest_report.passed(before.outcomes, t)]:
        return f"FAIL_TO_PASS passes before the fix: {passing[0]}"
    if failing := [t for t in instance.pass_to_pass if not pytest_report.passed(before.outcomes, t)]:
        return f"PASS_TO_PASS fails before the fix: {failing[0]}"
    try:
        apply_patch(folder, instance.patch)
    except ValueError as error:
        return f"patch does not apply: {error}"
    after = run(folder, test_files)
    tests = [*instance.fail_to_pass, *instance.pass_to_pass]
    if failing := [t for t in tests if not pytest_report.passed(after.outcomes, t)]:
        return f"fails after the fix: {failing[0]}"
    for path in _DIFF_FILE.findall(instance.test_patch + instance.patch):
        if (folder / path).read_text() != repository.read(repo, pristine, path):
            return f"{path} differs from the pristine file after both patches"
    return None
