"""The Dockerfiles reference files that exist, install the same dependency versions as pyproject.toml, build
FROM the debootstrap base of images/base.py (images/build.py builds them with buildah; tests/images runs
the built images), and carry the OCI labels and the tag the chart and the operator name."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import REPO
from helpers.dockerfile import instructions

from kuberl_app.cli import main

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


# ------------------------------------------------------------------------------ the images' base
# Every image is built FROM the debootstrap base of images/base.py (Debian bookworm and its python3), or FROM
# an image of ours that is; its Python is tried inside the built images (tests/images/test_image_python.py).
BASE = "localhost/kuberl/base:bookworm"
OWN_IMAGES = {"ghcr.io/kuberl/sandbox": REPO / "env-images/sandbox/Dockerfile"}
SKIPPED_DIRS = {".venv", "node_modules"}
TIER_DOCKERFILES = [
    "operator/Dockerfile",
    "trainer/Dockerfile",
    "rollout-server/Dockerfile",
    "env-images/sandbox/Dockerfile",
]


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


def repository(image: str) -> str:
    """ghcr.io/kuberl/sandbox of ghcr.io/kuberl/sandbox:0.1.0@sha256:...; a registry port is not a tag."""
    name = image.split("@")[0]
    repo, colon, tag = name.rpartition(":")
    return repo if colon and "/" not in tag else name


def test_base_images_resolve_args_and_skip_build_stages():
    assert base_images(REPO / "env-images/swe-python/Dockerfile") == ["ghcr.io/kuberl/sandbox:0.1.0"]
    assert base_images(REPO / "env-images/sandbox/Dockerfile") == [BASE, BASE]  # build stage, then the image
    assert repository("localhost:5000/python") == "localhost:5000/python"


def test_every_dockerfile_is_found():
    found = {str(p.relative_to(REPO)) for p in all_dockerfiles()}
    assert {*TIER_DOCKERFILES, "env-images/swe-python/Dockerfile"} <= found


def test_the_base_the_dockerfiles_default_to_is_the_builders():
    spec = importlib.util.spec_from_file_location("kuberl_images_base", REPO / "images/base.py")
    assert spec and spec.loader
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    assert f"{base.REPOSITORY}:{base.SUITE}" == BASE


@pytest.mark.parametrize("dockerfile", all_dockerfiles(), ids=lambda p: str(p.parent.relative_to(REPO)))
def test_every_image_builds_from_the_debootstrap_base(dockerfile):
    for image in base_images(dockerfile):
        while (own := OWN_IMAGES.get(repository(image))) is not None:
            image = base_images(own)[-1]
        assert image == BASE, f"{dockerfile.relative_to(REPO)}: FROM {image}; build FROM ${{BASE}} ({BASE})"


@pytest.mark.parametrize("dockerfile", TIER_DOCKERFILES)
def test_every_tier_image_is_labelled_and_tagged_as_the_chart_names_it(dockerfile):
    text = (REPO / dockerfile).read_text()
    labels = " ".join(rest for kw, rest in instructions(REPO / dockerfile) if kw == "LABEL")
    for key in ("version", "revision", "source", "title", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels, f"{dockerfile}: no {key} label"
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in labels
    assert re.search(r"docker build .* -t ghcr\.io/kuberl/[a-z]+:[0-9][\w.-]* \.", text), f"{dockerfile}: no tag line"
