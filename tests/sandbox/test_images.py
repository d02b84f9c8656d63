"""The env-image Dockerfiles (which cannot be built here: no Docker engine) reference files that exist,
pin their bases, and install the same dependency versions as pyproject.toml."""

from __future__ import annotations

import re
import shlex
import tomllib

import pytest
from click.testing import CliRunner
from conftest import REPO
from helpers.dockerfile import instructions

from kuberl.cli import main

DOCKERFILES = sorted((REPO / "env-images").glob("*/Dockerfile"))


def test_there_are_a_base_and_a_swe_image():
    assert {p.parent.name for p in DOCKERFILES} == {"sandbox", "swe-python"}


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_copied_file_exists(dockerfile):
    copies = [rest for kw, rest in instructions(dockerfile) if kw == "COPY" and not rest.startswith("--from")]
    assert copies
    for rest in copies:
        *sources, _ = shlex.split(rest)
        for source in sources:
            assert (REPO / source).exists(), f"{dockerfile.parent.name}: COPY {source} does not exist"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(dockerfile):
    for kw, rest in instructions(dockerfile):
        if kw == "FROM":
            image = rest.split()[0]
            assert image.startswith("${") or re.search(r":[0-9][\w.-]*", image), f"unpinned base image {image}"


def test_the_entrypoint_is_a_real_command():
    entry = next(rest for kw, rest in instructions(REPO / "env-images/sandbox/Dockerfile") if kw == "ENTRYPOINT")
    argv = __import__("json").loads(entry)
    assert argv[:2] == ["kuberl", "sandbox"]
    result = CliRunner().invoke(main, [*argv[1:], "--help"])
    assert result.exit_code == 0, result.output


def test_image_requirements_match_pyproject_pins():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = dict(d.split("==") for d in deps if "==" in d)
    lines = (REPO / "env-images/sandbox/requirements.txt").read_text().splitlines()
    for line in (ln for ln in lines if ln and not ln.startswith("#")):
        name, version = line.split("==")
        assert pins.get(name) == version, f"{name}=={version} differs from pyproject.toml ({pins.get(name)})"
