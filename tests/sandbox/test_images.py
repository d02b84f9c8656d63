"""The env-image Dockerfiles (which cannot be built here: no Docker engine) reference files that exist,
pin their bases, install the same dependency versions as pyproject.toml, and every image of the repository
runs a Python with the tarfile fix of CVE-2025-4517."""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path

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


# ------------------------------------------------------------------------------ the images' Python
# CVE-2025-4517: tarfile's extraction filters could be bypassed with symlink chains past PATH_MAX, writing
# outside the destination; sandbox snapshots are restored with tarfile. The first fixed release of each line
# (3.14.0 shipped fixed); older lines never got the fix.
TARFILE_FIXED = {(3, 9): 23, (3, 10): 18, (3, 11): 13, (3, 12): 11, (3, 13): 4}
FIRST_LINE_RELEASED_FIXED = (3, 14)
OFFICIAL_PYTHON = {"python", "library/python", "docker.io/python", "docker.io/library/python"}
# Our own images some Dockerfiles build FROM, and where each is built (its Python is checked there).
OWN_IMAGES = {"ghcr.io/kuberl/sandbox": REPO / "env-images/sandbox/Dockerfile"}
SKIPPED_DIRS = {".venv", "node_modules"}


def all_dockerfiles() -> list[Path]:
    """Every Dockerfile of the repository, outside hidden folders and virtual environments."""
    tops = [p for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name not in SKIPPED_DIRS]
    found = [f for top in tops for f in top.rglob("Dockerfile*") if f.is_file()]
    return sorted(f for f in found if not SKIPPED_DIRS & set(f.relative_to(REPO).parts))


def base_images(dockerfile: Path) -> list[str]:
    """The image of every FROM, ARG defaults substituted, references to earlier build stages left out."""
    args: dict[str, str] = {}
    stages: set[str] = set()
    images = []
    for keyword, rest in instructions(dockerfile):
        if keyword == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip("\"'")
        if keyword == "FROM":
            words = [w for w in rest.split() if not w.startswith("--")]  # --platform=...
            image = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m[1] or m[2], m[0]), words[0])
            if image not in stages:
                images.append(image)
            if len(words) == 3 and words[1].upper() == "AS":
                stages.add(words[2])
    return images


def repository_and_tag(image: str) -> tuple[str, str]:
    """("python", "3.11.17-slim-bookworm") of python:3.11.17-slim-bookworm@sha256:...; a registry port is
    not a tag."""
    name = image.split("@")[0]
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        return name, "latest"
    return repository, tag


def python_release(image: str) -> tuple[int, ...] | None:
    """(3, 11, 17) of an official Python image pinned to a release, (3, 11) or () of one on a floating tag,
    None for an image that is not the official Python one."""
    repository, tag = repository_and_tag(image)
    if repository not in OFFICIAL_PYTHON:
        return None
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?(?=$|[-.])", tag)
    return tuple(int(part) for part in match.groups() if part is not None) if match else ()


def has_the_tarfile_fix(release: tuple[int, ...]) -> bool:
    if len(release) < 3:  # a floating tag (3.11, 3): no telling which release a build gets
        return False
    line, patch = release[:2], release[2]
    return line >= FIRST_LINE_RELEASED_FIXED or patch >= TARFILE_FIXED.get(line, float("inf"))


@pytest.mark.parametrize(
    ("image", "fixed"),
    [
        ("python:3.11.7-slim-bookworm", False),
        ("python:3.11.12", False),
        ("python:3.11.13", True),
        ("python:3.11.17-slim-bookworm@sha256:0a310eeecf4e", True),
        ("docker.io/library/python:3.10.18-bookworm", True),
        ("python:3.12.10-slim", False),
        ("python:3.12.11", True),
        ("python:3.13.3-alpine", False),
        ("python:3.13.4", True),
        ("python:3.14.0-slim", True),
        ("python:3.9.22", False),
        ("python:3.8.20", False),
        ("python:3.11-slim", False),
        ("python:3", False),
        ("python", False),
    ],
)
def test_the_release_check_knows_the_fixed_release_of_every_line(image, fixed):
    assert has_the_tarfile_fix(python_release(image)) is fixed


def test_base_images_resolve_args_and_skip_build_stages():
    assert base_images(REPO / "env-images/swe-python/Dockerfile") == ["ghcr.io/kuberl/sandbox:0.1.0"]
    assert len(base_images(REPO / "env-images/sandbox/Dockerfile")) == 2  # build stage, then the image
    assert python_release("localhost:5000/python") is None and python_release("ghcr.io/kuberl/sandbox:0.1.0") is None


def test_every_dockerfile_is_found():
    found = {str(p.relative_to(REPO)) for p in all_dockerfiles()}
    assert {
        "env-images/sandbox/Dockerfile",
        "env-images/swe-python/Dockerfile",
        "operator/Dockerfile",
        "rollout-server/Dockerfile",
        "trainer/Dockerfile",
    } <= found


@pytest.mark.parametrize("dockerfile", all_dockerfiles(), ids=lambda p: str(p.parent.relative_to(REPO)))
def test_every_image_runs_a_python_with_the_tarfile_fix(dockerfile):
    for image in base_images(dockerfile):
        release = python_release(image)
        if release is None:
            # an image of ours is checked where it is built; any other base would hide its Python from here
            assert repository_and_tag(image)[0] in OWN_IMAGES, f"{image}: cannot tell its Python; use python:X.Y.Z"
            continue
        assert has_the_tarfile_fix(release), (
            f"{dockerfile.relative_to(REPO)}: {image} lacks the fix of CVE-2025-4517 (tarfile filter bypass); pin "
            f"a release at least {'.'.join(map(str, release[:2]))}.{TARFILE_FIXED.get(release[:2], '?')}"
        )


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.parent.name)
def test_every_env_image_ends_in_a_python_with_the_tarfile_fix(dockerfile):
    # follows FROM through our own images (swe-python is FROM ${BASE}, the sandbox image)
    image = base_images(dockerfile)[-1]
    while (own := OWN_IMAGES.get(repository_and_tag(image)[0])) is not None:
        image = base_images(own)[-1]
    assert has_the_tarfile_fix(python_release(image) or ()), f"{dockerfile.parent.name} ends in {image}"
