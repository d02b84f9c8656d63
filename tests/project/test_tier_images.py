"""The images of the operator, the learner and the rollout server (built by images/build.py; tests/images runs
them): every copied file exists, bases are pinned (or the builder's `${BASE}`), the entrypoint is a real
`kuberl` command, the operator's slim requirements carry pyproject's pins and cover everything `kuberl operator`
imports."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest
from click.testing import CliRunner
from conftest import REPO
from helpers.dockerfile import instructions
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from kuberl_app.cli import main

IMAGES = {"operator": "operator", "learner": "trainer", "rollout": "rollout-server"}
DOCKERFILES = {name: REPO / folder / "Dockerfile" for name, folder in IMAGES.items()}


@pytest.mark.parametrize("name", IMAGES)
def test_every_copied_file_exists_and_bases_are_pinned(name):
    for keyword, rest in instructions(DOCKERFILES[name]):
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = shlex.split(rest)
            for source in sources:
                assert (REPO / source).exists(), f"{name}: COPY {source} does not exist"
        if keyword == "FROM":
            image = rest.split()[0]
            # ${BASE}: the debootstrap base images/build.py passes, tagged by its inputs' digest
            assert image.startswith("${") or re.search(r":[0-9][\w.-]*", image), f"{name}: unpinned base {image}"


@pytest.mark.parametrize("name", IMAGES)
def test_the_entrypoint_is_a_real_command_and_the_image_runs_unprivileged(name):
    steps = list(instructions(DOCKERFILES[name]))
    argv = json.loads(next(rest for kw, rest in steps if kw == "ENTRYPOINT"))
    assert argv[0] == "kuberl"
    result = CliRunner().invoke(main, [*argv[1:], "--help"])
    assert result.exit_code == 0, result.output
    assert ("USER", "65532:65532") in steps  # what the operator's restricted security context runs as


def test_the_operator_requirements_carry_pyproject_pins():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(d.split("==") for d in deps if "==" in d)
    for requirement in _operator_requirements():
        assert pins.get(requirement.name) == str(requirement.specifier).removeprefix("=="), requirement


def test_the_operator_requirements_cover_what_kuberl_operator_imports():
    """`kuberl operator`'s modules import in a process that can see only the standard library, the kuberl
    packages and the distributions operator/requirements.txt installs (with their dependencies): as in the
    image. Optional imports (the kubernetes client tries kubernetes_validate) then fail as they would there."""
    closure = _closure({canonicalize_name(r.name) for r in _operator_requirements()})
    visible = sorted(
        {
            module
            for module, dists in metadata.packages_distributions().items()
            if any(canonicalize_name(d) in closure for d in dists)
        }
    )
    assert "torch" not in visible and "kopf" in visible
    code = f"""
import importlib.abc, sys
VISIBLE = set({visible!r}) | set(sys.stdlib_module_names) | {{"kuberl", "kuberl_app", "kuberl_operator",
    "kuberl_trainer", "kuberl_rollout", "kuberl_sandbox", "_distutils_hack"}}
class Hide(importlib.abc.MetaPathFinder):
    # each finder of this process, seeing nothing outside the image (find_spec answers None, as there)
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if top not in VISIBLE and not top.startswith("_"):  # "_": the interpreter's private modules
            return None
        return self.finder.find_spec(name, path, target) if hasattr(self.finder, "find_spec") else None
sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
import kuberl_app.cli, kuberl_operator.handlers
from click.testing import CliRunner
result = CliRunner().invoke(kuberl_app.cli.main, ["operator", "--help"])
assert result.exit_code == 0, result.output
print("imported:", "torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "imported: False"


def _operator_requirements() -> list[Requirement]:
    lines = (REPO / "operator/requirements.txt").read_text().splitlines()
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


def _closure(names: set[str]) -> set[str]:
    """The distributions `names` install, their dependencies included (extras left out)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(requirement.name))
    return seen
