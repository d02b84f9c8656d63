"""Shared fixtures: where the repository is, and a valid RLJob manifest to break in tests."""

from __future__ import annotations

import copy
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # console scripts (kuberl, ruff, torchrun, helm) beside the interpreter
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
sys.path.insert(0, str(REPO / "tests"))  # for `helpers`
# and the repository right after it: otherwise `recipes` is the test folder tests/recipes (a namespace package,
# found before the editable install's finder is asked) instead of the package recipes/
sys.path.insert(1, str(REPO))
# Idle OpenMP threads sleep instead of spinning. The suite runs three workers on two cores, each with torch in its
# own process and in the servers it starts: spinning threads then burn the cores the others wait for (three
# copy-pretraining runs side by side, measured on 2 cores: 255 s with spinning threads, 82 s with sleeping ones).
# Set before any test module imports torch; the processes the tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# And one thread each: with three workers on two cores the machine is always full, so a second intra-op thread
# only adds hand-overs between threads (the same three runs: 74 s with one thread each).
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadfile` (pyproject.toml's addopts) with the longest files first (tests/helpers/file_scheduling.py)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from helpers.file_scheduling import LongestFirstFileScheduling

    return LongestFirstFileScheduling(config, log)


def tool(name: str) -> str:
    """A program from the virtual environment's bin (where `make install` puts helm, promtool and prometheus when the
    machine has none) or PATH; its bare name when neither has it, so the test fails saying which."""
    return shutil.which(name, path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")])) or name


BASE_MANIFEST: dict[str, Any] = {
    "apiVersion": "kuberl.io/v1alpha1",
    "kind": "RLJob",
    "metadata": {"name": "unit"},
    "spec": {"model": {"uri": "s3://models/tiny"}},
}


@pytest.fixture
def manifest() -> dict[str, Any]:
    """A fresh, valid, minimal RLJob manifest."""
    return copy.deepcopy(BASE_MANIFEST)


def with_spec(**sections: dict[str, Any]) -> dict[str, Any]:
    """The base manifest with spec sections merged in (one level deep)."""
    doc = copy.deepcopy(BASE_MANIFEST)
    for name, value in sections.items():
        doc["spec"].setdefault(name, {}).update(value)
    return doc


@pytest.fixture(scope="session")
def sandbox():
    """One real `kuberl sandbox` server process shared by the tests of a run."""
    from kuberl_sandbox.local import local_sandbox

    with local_sandbox() as server:
        yield server


@pytest.fixture(scope="session")
def second_sandbox(sandbox):
    """Another server process of the same job (the same token, so the same snapshot key): where snapshots
    are restored."""
    from kuberl_sandbox.local import local_sandbox

    with local_sandbox(token=sandbox.token) as server:
        yield server


@pytest.fixture(scope="session")
def agent_server(sandbox, tmp_path_factory):
    """A real rollout server whose job names an external agent (tests/helpers/agent_server.py), started once."""
    from helpers.agent_server import agent_server as running

    with running(sandbox, tmp_path_factory.mktemp("agent-server")) as server:
        yield server
