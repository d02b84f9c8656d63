"""SWE-bench-style instance images of two small real repositories, built with the project's own image tooling
(buildah, FROM the debootstrap base of images/base.py) and without KubeRL in them, as a dataset ships them:

- the repository at the instance's base commit at /testbed, with its git history up to that commit only;
- a virtual environment with pytest and the repository's test dependencies, first on PATH (/opt/venv/bin);
- nothing of KubeRL: a sandbox pod runs the server from the portable bundle (kuberl/portable_server.py).

    instance_image("semver")       -> "localhost/kuberl-tests/swe-semver:<digest>"
    instance_rows()                -> SWE-bench rows (dicts) with `image` set, one solvable instance per repository
    shellless_image()              -> an image without /bin/sh (the portable server refuses to serve in it)

Repositories: semver 3.0.4 (tests/helpers/swe_repos.py: a bug in bump_patch) and inflection 0.5.1 (one of the
factory's pinned packages: a bug in dasherize); their source distributions are fetched by pip. Each image is
built once and kept, tagged with a digest of what it is made of (the recipe, the base, the commit). Building needs
root, buildah and PyPI (pip in the build), as tests/helpers/built_images.py does; the images land in the local
container storage (vfs).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from helpers import swe_repos
from helpers.built_images import REPO, STORAGE, exclusive_build, image_exists
from helpers.sdists import sdist

REPOSITORY = "localhost/kuberl-tests"
REPOSITORIES = ("semver", "inflection")
WORKDIR = "/testbed"
VENV = "/opt/venv"
CONTAINERFILE = f"""\
ARG BASE
FROM ${{BASE}}
COPY testbed {WORKDIR}
RUN python3 -m venv {VENV} && {VENV}/bin/pip install --no-cache-dir --disable-pip-version-check {{packages}}
ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR {WORKDIR}
"""
INFLECTION_BUG = ("return word.replace('_', '-')", "return word.replace('_', '')")
INFLECTION_TESTS = """from inflection import dasherize


def test_dasherize_replaces_each_underscore():
    assert dasherize("puni_puni") == "puni-puni"


def test_dasherize_many_words():
    assert dasherize("a_b_c") == "a-b-c"
"""


@dataclass(frozen=True)
class InstanceRepository:
    """One repository of the images: its checkout at the base commit and its solvable instance."""

    name: str
    checkout: Path
    row: dict
    packages: tuple[str, ...]


def instance_image(name: str) -> str:
    """The local reference of `name`'s instance image ("semver" or "inflection"), built on first use."""
    with tempfile.TemporaryDirectory(prefix="kuberl-instance-") as work:
        repository = _repository(name, Path(work))
        return _build(repository, Path(work))


def instance_rows() -> list[dict]:
    """SWE-bench-format rows (JSONL dicts, FAIL_TO_PASS as JSON strings) of both repositories, each with `image`
    set to its instance image and `workdir` /testbed; each row's gold `patch` resolves it."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="kuberl-instance-") as work:
        for name in REPOSITORIES:
            repository = _repository(name, Path(work) / name)
            rows.append(dict(repository.row, image=_build(repository, Path(work) / name), workdir=WORKDIR))
    return rows


def shellless_image() -> str:
    """An image with the repository folder but no shell and no libc (nothing but /testbed)."""
    reference = f"{REPOSITORY}/no-shell:1"
    with exclusive_build():
        if image_exists(reference):
            return reference
        container = _buildah("from", "scratch")
        try:
            with tempfile.TemporaryDirectory() as empty:
                _buildah("copy", container, empty, WORKDIR)
            _buildah("commit", "--quiet", container, reference)
        finally:
            _buildah("rm", container)
    return reference


def _repository(name: str, work: Path) -> InstanceRepository:
    work.mkdir(parents=True, exist_ok=True)
    if name == "semver":
        data = swe_repos.make_dataset(work)
        row = data.rows[0]
        packages = tuple(row["install_config"]["pip_packages"])
        return InstanceRepository(name, data.mirror / swe_repos.REPO.replace("/", "__"), row, packages)
    if name == "inflection":
        return _inflection(work)
    raise ValueError(f"no instance image {name!r}: one of {', '.join(REPOSITORIES)}")


def _inflection(work: Path) -> InstanceRepository:
    """inflection 0.5.1 with a bug in dasherize; the test patch adds regression tests (hand-made, as semver's)."""
    repo = work / "inflection"
    source = _sdist("inflection", "0.5.1", work / "sdist")
    shutil.copytree(source, repo, ignore=shutil.ignore_patterns("*.egg-info", "__pycache__", "PKG-INFO"))
    git = _git_in(repo)
    git("init", "-q", "-b", "main")
    git("add", "-A")
    git("commit", "-q", "-m", "inflection 0.5.1")
    pristine = git("rev-parse", "HEAD").strip()
    module = repo / "inflection/__init__.py"
    module.write_text(module.read_text().replace(*INFLECTION_BUG))
    git("commit", "-q", "-am", "dasherize drops underscores")
    base = git("rev-parse", "HEAD").strip()
    gold = git("diff", "HEAD", "HEAD~1", "--", "inflection")
    (repo / "test_issue_dasherize.py").write_text(INFLECTION_TESTS)
    git("add", "test_issue_dasherize.py")
    test_patch = git("diff", "--cached")
    git("reset", "-q", "--hard")
    row = {
        "instance_id": "jpvanhal__inflection-1",
        "repo": "jpvanhal/inflection",
        "base_commit": base,
        "patch": gold,
        "test_patch": test_patch,
        "problem_statement": "dasherize('puni_puni') returns 'punipuni': underscores should become dashes.",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "0.5",
        "environment_setup_commit": pristine,
        "FAIL_TO_PASS": json.dumps(
            [
                f"test_issue_dasherize.py::{t}"
                for t in ("test_dasherize_replaces_each_underscore", "test_dasherize_many_words")
            ]
        ),
        "PASS_TO_PASS": json.dumps(
            ["test_inflection.py::test_pluralize_plurals", "test_inflection.py::test_camelize_with_underscores"]
        ),
    }
    return InstanceRepository("inflection", repo, row, ("pytest==9.2.0",))


def _build(repository: InstanceRepository, work: Path) -> str:
    with exclusive_build():
        return _build_locked(repository, work)


def _build_locked(repository: InstanceRepository, work: Path) -> str:
    base = _base_image()
    containerfile = CONTAINERFILE.replace("{packages}", " ".join(repository.packages))
    recipe = {"containerfile": containerfile, "base": base, "commit": repository.row["base_commit"]}
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    reference = f"{REPOSITORY}/swe-{repository.name}:{digest}"
    if image_exists(reference):
        return reference
    context = work / "context"
    context.mkdir()
    (context / "Containerfile").write_text(containerfile)
    shutil.copytree(repository.checkout, context / "testbed", symlinks=True)
    command = ["buildah", *STORAGE, "bud", "--isolation", "chroot", "--layers=false", "--quiet", "--format", "docker"]
    command += ["--build-arg", f"BASE={base}", "-f", str(context / "Containerfile"), "-t", reference]
    if ca := _ca_bundle():  # pip behind a TLS-inspecting proxy, as images/build.py does
        command += ["--volume", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro"]
    subprocess.run([*command, str(context)], check=True, stdout=subprocess.DEVNULL)
    return reference


def _base_image() -> str:
    spec = importlib.util.spec_from_file_location("kuberl_images_base", REPO / "images/base.py")
    assert spec is not None and spec.loader is not None
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    return base.ensure(log=lambda line: None)


def _ca_bundle() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def _sdist(package: str, version: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.unpack_archive(sdist(package, version), folder, filter="data")
    return folder / f"{package}-{version}"


def _git_in(repo: Path):
    def git(*args: str) -> str:
        env = {**os.environ, **swe_repos.GIT_ENV}
        done = subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True, text=True)
        return done.stdout

    return git


def _buildah(*args: str) -> str:
    return subprocess.run(["buildah", *STORAGE, *args], check=True, capture_output=True, text=True).stdout.strip()
