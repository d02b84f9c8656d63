"""What a session must not see of the machine: the server's own installation (the code that generates tasks
and their hidden checks, a source checkout and its git history) and the task store of the job.

Each such folder is covered, in every command's mount namespace, by an empty read-only file system
(execution.py). Folders a session needs (the sandbox root, prepared environments, the interpreter) stay
visible even inside a covered folder: the cover goes on each sibling around them instead.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("kuberl", "kuberl_app", "kuberl_sandbox", "kuberl_rollout", "kuberl_trainer", "kuberl_operator")
"""The importable packages of the KubeRL distribution, wherever they are installed."""
SOURCE_MARKER = "pyproject.toml"
SYSTEM = tuple(Path(p) for p in ("/bin", "/etc", "/lib", "/lib64", "/opt", "/sbin", "/usr", "/var"))
"""What every session runs on: a folder above one of these is never covered (a task file in / is, say, not
worth every session's interpreter)."""


def installation_folders(packages: Iterable[str] = PACKAGES) -> list[Path]:
    """The folder of each installed package of `packages`, and the source checkout `kuberl` lives in (a folder
    with a pyproject.toml above it: it holds every tier, the tests, and the history in `.git`)."""
    folders: list[Path] = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        folder = Path(next(iter(spec.submodule_search_locations))).resolve()
        folders.append(folder)
        if name == "kuberl" and (folder.parent / SOURCE_MARKER).is_file():
            folders.append(folder.parent)
    return folders


def folders_to_cover(roots: Iterable[Path], keep: Iterable[Path], invisible: Iterable[Path] = ()) -> list[Path]:
    """The folders to cover so that nothing under `roots` is seen but the `keep` paths (and the folders
    leading to them; files beside those folders stay, only folders are covered). Roots under an `invisible`
    folder (the host's /tmp, which sessions see a private copy of) need no cover; nor does a root inside
    another. Sorted, each once."""
    # a kept path that is a link (a venv's `python`) must stay reachable as named and where it points
    kept = [Path(form(k)) for k in keep for form in (os.path.abspath, os.path.realpath)]
    hidden_anyway = [Path(os.path.realpath(i)) for i in invisible]
    real_roots = {Path(os.path.realpath(r)) for r in roots if os.path.isdir(r)}
    eligible = [
        root
        for root in sorted(real_roots)
        if not any(root.is_relative_to(i) for i in hidden_anyway) and not any(s.is_relative_to(root) for s in SYSTEM)
    ]
    covers: list[Path] = []
    for root in eligible:
        if not any(root != other and root.is_relative_to(other) for other in eligible):
            covers.extend(_cover(root, kept))
    return sorted(set(covers))


def _cover(folder: Path, kept: list[Path]) -> list[Path]:
    if any(folder.is_relative_to(k) for k in kept):
        return []
    if not any(k.is_relative_to(folder) for k in kept):
        return [folder]
    covers: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return []
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            covers.extend(_cover(Path(entry.path), kept))
    return covers
