"""Pinned PyPI packages as source trees: the requirement, its source distribution (fetched with pip, kept in a
cache) and the unpacked tree, which holds the package's own tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PACKAGES = (
    "inflection==0.5.1",
    "toolz==1.0.0",
    "cachetools==5.5.0",
    "parse==1.20.2",
    "pathspec==0.12.1",
    "jmespath==1.0.1",
    "tabulate==0.9.0",
    "sqlparse==0.5.3",
)
"""Pure-Python packages whose sdists ship tests that pass with plain pytest and their install dependencies."""

DOWNLOAD_TIMEOUT_S = 300
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9][A-Za-z0-9.+!_-]*)\s*$")
_BUILD_LEFTOVERS = ("__pycache__", ".pytest_cache", ".mypy_cache", ".tox", ".nox", ".eggs")


class FactoryError(RuntimeError):
    """A package the factory cannot use, said in one line that names it and what to do."""


@dataclass(frozen=True)
class Requirement:
    """A pinned package, `name==version`, with its name normalized as PyPI does (PEP 503)."""

    name: str
    version: str

    @property
    def repo(self) -> str:
        return f"pypi/{self.name}"

    @property
    def mirror_name(self) -> str:
        return f"pypi__{self.name}"

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def parse_requirement(text: str) -> Requirement:
    """`Name==1.2` -> Requirement("name", "1.2"); FactoryError for anything not pinned to one version."""
    match = _REQUIREMENT.match(text)
    if match is None:
        raise FactoryError(f"{text!r}: expected a pinned package, name==version (for example inflection==0.5.1)")
    return Requirement(re.sub(r"[-_.]+", "-", match.group(1)).lower(), match.group(2))


def fetch_sdist(requirement: Requirement, cache: Path) -> Path:
    """The package's source distribution, downloaded once with pip into `cache/<name>-<version>/`."""
    folder = cache / f"{requirement.name}-{requirement.version}"
    if archives := _archives(folder):
        return archives[0]
    cache.mkdir(parents=True, exist_ok=True)
    os.chmod(cache, 0o700)  # the pristine source is every instance's fix
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    argv += ["--disable-pip-version-check", "-d", str(partial), str(requirement)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise FactoryError(
            f"{requirement}: pip download took over {DOWNLOAD_TIMEOUT_S} s; is PyPI reachable?"
        ) from None
    if done.returncode != 0 or not _archives(partial):
        tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-2:])
        raise FactoryError(f"{requirement}: pip found no source distribution ({tail}); check the name and version")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
    return _archives(folder)[0]


def _archives(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".zip")))


def unpack(archive: Path, into: Path) -> Path:
    """The source tree of an sdist, unpacked under `into` (its single top folder), without build leftovers."""
    into.mkdir(parents=True, exist_ok=True)
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zipped:
            for name in zipped.namelist():
                if name.startswith("/") or ".." in Path(name).parts:
                    raise FactoryError(f"{archive.name}: unsafe path {name!r} in the archive; use another version")
            zipped.extractall(into)
    else:
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
    entries = list(into.iterdir())
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else into
    for path in sorted(root.rglob("*"), reverse=True):
        if path.name in _BUILD_LEFTOVERS and path.is_dir():
            shutil.rmtree(path)
        elif path.suffix in (".pyc", ".pyo") and path.is_file():
            path.unlink()
    return root
