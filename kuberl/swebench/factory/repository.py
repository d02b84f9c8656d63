"""The mirror repository of a package: its pristine commit, instance commits on top of it, and diffs.

Commits are reproducible: a fixed author, committer and date, so the same sdist and the same bug give the
same commit ids on every run. Instance commits are kept by refs (`refs/kuberl/<instance id>`), never by a
branch that could move, so git never collects them. The folder is private (0700): it holds every fix.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from kuberl.swebench.mirror import git

PRISTINE_TAG = "kuberl/pristine"
FIXED_DATE = "2025-01-01T00:00:00+00:00"
IDENTITY = {
    "GIT_AUTHOR_NAME": "KubeRL task factory",
    "GIT_AUTHOR_EMAIL": "factory@kuberl.invalid",
    "GIT_COMMITTER_NAME": "KubeRL task factory",
    "GIT_COMMITTER_EMAIL": "factory@kuberl.invalid",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_DATE": FIXED_DATE,
}
# Settings of whoever runs the factory must not change what is written (signing, prefixes, hooks).
_NEUTRAL = ("-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null", "-c", "core.autocrlf=false")


def _write(repository: Path, *args: str, stdin: bytes | None = None, index: Path | None = None) -> bytes:
    """Run a git command that writes objects or refs, as the factory's fixed identity."""
    env = {**os.environ, **IDENTITY, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    done = subprocess.run(
        ["git", "-C", str(repository), *_NEUTRAL, *args], input=stdin, capture_output=True, env=env, check=False
    )
    if done.returncode != 0:
        message = done.stderr.decode(errors="replace").strip()
        raise RuntimeError(f"git {' '.join(args[:2])} in {repository}: {message}")
    return done.stdout


def pristine_repository(repository: Path, tree: Path, message: str) -> str:
    """The pristine commit of `repository` (made from the files of `tree` when the repository is new)."""
    if (repository / ".git").exists():
        return git(repository, "rev-parse", "--verify", f"refs/tags/{PRISTINE_TAG}^{{commit}}").decode().strip()
    building = Path(tempfile.mkdtemp(dir=repository.parent, prefix=f".{repository.name}."))
    try:
        shutil.copytree(tree, building, symlinks=True, dirs_exist_ok=True)
        _write(building, "init", "-q", "-b", "main")
        _write(building, "add", "-A", "-f")
        _write(building, "commit", "-q", "--no-verify", "-m", message)
        _write(building, "tag", PRISTINE_TAG)
        os.chmod(building, 0o700)  # copytree gave it the sdist folder's mode
        os.replace(building, repository)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return git(repository, "rev-parse", "--verify", "HEAD^{commit}").decode().strip()


def files_at(repository: Path, commit: str) -> list[str]:
    """The paths of the commit's regular files."""
    listing = git(repository, "ls-tree", "-r", "-z", "--full-tree", commit).decode()
    return sorted(entry.split("\t", 1)[1] for entry in listing.split("\0") if entry and " blob " in entry)


def read(repository: Path, commit: str, path: str) -> str:
    return git(repository, "show", f"{commit}:{path}").decode()


def commit_changes(repository: Path, parent: str, changes: dict[str, str | None], message: str) -> str:
    """A commit on top of `parent` whose tree is the parent's with these files changed (None: removed)."""
    lines = []
    for path, content in sorted(changes.items()):
        if content is None:
            lines.append(f"0 {'0' * 40}\t{path}")
            continue
        blob = _write(repository, "hash-object", "-w", "--stdin", stdin=content.encode()).decode().strip()
        mode = git(repository, "ls-tree", parent, "--", path).decode().split(" ", 1)[0] or "100644"
        lines.append(f"{mode} {blob}\t{path}")
    with tempfile.TemporaryDirectory(prefix="kuberl-index-") as scratch:
        index = Path(scratch) / "index"
        _write(repository, "read-tree", parent, index=index)
        _write(repository, "update-index", "--index-info", stdin=("\n".join(lines) + "\n").encode(), index=index)
        tree = _write(repository, "write-tree", index=index).decode().strip()
    return _write(repository, "commit-tree", tree, "-p", parent, "-m", message).decode().strip()


def set_ref(repository: Path, ref: str, commit: str) -> None:
    _write(repository, "update-ref", ref, commit)


def delete_ref(repository: Path, ref: str) -> None:
    _write(repository, "update-ref", "-d", ref)


def diff(repository: Path, old: str, new: str, paths: list[str]) -> str:
    """The unified diff (git format, a/ and b/ prefixes) that turns `old` into `new` for these paths."""
    return git(
        repository,
        "-c",
        "diff.noprefix=false",
        "-c",
        "diff.mnemonicPrefix=false",
        "diff",
        "--no-color",
        "--no-ext-diff",
        "--no-renames",
        "--src-prefix=a/",
        "--dst-prefix=b/",
        old,
        new,
        "--",
        *paths,
    ).decode()


def export(repository: Path, commit: str, into: Path) -> None:
    """The commit's tree written into the folder `into` (made when missing); no history comes with it."""
    into.mkdir(parents=True, exist_ok=True)
    data = git(repository, "archive", "--format=tar", commit)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
