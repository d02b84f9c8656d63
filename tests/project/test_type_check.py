"""The contract package (kuberl/api) and the pure algorithm modules type-check: mypy, configured in
pyproject.toml ([tool.mypy]: which files, how strict), run with the interpreter running the tests."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO


def test_mypy_finds_no_errors():
    result = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
