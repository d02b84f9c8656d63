"""A real repository in a mirror, and SWE-bench-format instances on it written by hand (not by the factory).

`semver` 3.0.4 (pinned; its source distribution fetched by pip when the tests run): a src-layout package whose
pytest configuration needs pytest-cov, with a conftest.py, so instances use an `install_config`. Instance 1 is
valid (a bug in `bump_patch`, a test patch that adds regression tests, the gold fix); instance 2 has a wrong
gold patch; instance 3 a gold patch that does not apply.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from helpers.sdists import sdist

PACKAGE, VERSION = "semver", "3.0.4"
REPO = "python-semver/python-semver"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "kuberl tests",
    "GIT_AUTHOR_EMAIL": "tests@kuberl.invalid",
    "GIT_COMMITTER_NAME": "kuberl tests",
    "GIT_COMMITTER_EMAIL": "tests@kuberl.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
BUG = ("self._minor, self._patch + 1)", "self._minor, self._patch + 2)")
REGRESSION_TESTS = """from semver import Version


def test_bump_patch_adds_one():
    assert Version.parse("1.2.3").bump_patch() == Version(1, 2, 4)


def test_bump_patch_from_zero():
    assert str(Version(0, 0, 0).bump_patch()) == "0.0.1"
"""
F2P = [
    "tests/test_issue_bump_patch.py::test_bump_patch_adds_one",
    "tests/test_issue_bump_patch.py::test_bump_patch_from_zero",
    "tests/test_bump.py::test_should_bump_patch",
]
P2P = ["tests/test_bump.py::test_should_bump_major", "tests/test_bump.py::test_should_bump_minor"]


@dataclass(frozen=True)
class HandMadeDataset:
    mirror: Path
    instances: Path
    rows: list[dict]


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True).stdout


def fetch_sdist(folder: Path) -> Path:
    """The unpacked source distribution of semver (pip, at test time)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist(PACKAGE, VERSION)) as tar:
        tar.extractall(folder, filter="data")
    return folder / f"{PACKAGE}-{VERSION}"


def make_dataset(work: Path) -> HandMadeDataset:
    """The mirror (one repository, 0700) and the instance file (FAIL_TO_PASS as JSON-encoded strings, as the
    SWE-bench datasets on the Hub store them)."""
    mirror = work / "mirror"
    repo = mirror / REPO.replace("/", "__")
    shutil.copytree(fetch_sdist(work / "sdist"), repo)
    os.chmod(mirror, 0o700)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "semver 3.0.4")
    pristine = _git(repo, "rev-parse", "HEAD").strip()
    source = repo / "src/semver/version.py"
    source.write_text(source.read_text().replace(*BUG))
    _git(repo, "commit", "-q", "-am", "bump_patch adds two")
    base = _git(repo, "rev-parse", "HEAD").strip()
    gold = _git(repo, "diff", "HEAD", "HEAD~1", "--", "src")
    (repo / "tests/test_issue_bump_patch.py").write_text(REGRESSION_TESTS)
    _git(repo, "add", "tests/test_issue_bump_patch.py")
    test_patch = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard")
    valid = {
        "instance_id": "python-semver__python-semver-1",
        "repo": REPO,
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "problem_statement": "Version.bump_patch() raises the patch part by two: 1.2.3 becomes 1.2.5, not 1.2.4.",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": 3.0,  # a number, as some exports write it
        "environment_setup_commit": pristine,
        "FAIL_TO_PASS": json.dumps(F2P),
        "PASS_TO_PASS": json.dumps(P2P),
        "install_config": {
            "python": "3.11",
            "pip_packages": ["pytest==9.2.0", "pytest-cov==6.0.0"],
            "install": ["pip install ."],
            "test_cmd": "pytest -rA",
            "log_parser": "parse_log_pytest",
        },
        "difficulty": "easy",  # a key of another dataset's: kept, not refused
    }
    wrong = dict(valid, instance_id="python-semver__python-semver-2", patch=gold.replace("+ 1)", "+ 3)"))
    unappliable = dict(valid, instance_id="python-semver__python-semver-3", patch=gold.replace("_minor,", "_mayor,"))
    rows = [valid, wrong, unappliable]
    instances = work / "instances.jsonl"
    instances.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return HandMadeDataset(mirror, instances, rows)
