"""The code base passes `make lint` (ruff check and ruff format)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import BIN, REPO

RUFF = str(BIN / "ruff")


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]], ids=["check", "format"])
def test_ruff(args):
    result = subprocess.run([RUFF, *args], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
