"""A mirror of git repositories, and the tree of one commit as a cached archive.

A mirror is a folder of git repositories named as SWE-bench names its images, `owner__name` (bare, as
`owner__name.git`, or with a work tree). An episode never clones: its workspace is unpacked from a tar of
the commit's tree, made once per commit with `git archive` and kept beside the others. The archive holds
no history, on purpose: a repository's later commits (for a made task, its parent) hold the fix.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

GIT = "git"


class MirrorError(ValueError):
    """A repository or commit the mirror does not have, said in one line."""


def repository_path(mirror: Path, repo: str) -> Path:
    """The repository `owner/name` in `mirror` (`owner__name`, bare `owner__name.git`, or `owner/name`)."""
    name = repo.replace("/", "__")
    for candidate in (mirror / name, mirror / f"{name}.git", mirror / repo):
        if (candidate / "HEAD").is_file() or (candidate / ".git").exists():
            return candidate
    raise MirrorError(f"repository {repo!r} is not in the mirror {mirror} (expected a git repository {name}/)")


def git(repository: Path, *args: str, stdin: bytes | None = None) -> bytes:
    """Run git in `repository`; its stderr in the error when it fails."""
    done = subprocess.run(
        # a mirror made by another user is still read (git refuses "dubious ownership" otherwise)
        [GIT, "-c", "safe.directory=*", "-C", str(repository), *args],
        input=stdin,
        capture_output=True,
        env={**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"},
        check=False,
    )
    if done.returncode != 0:
        raise MirrorError(f"git {' '.join(args[:2])} in {repository}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def resolve_commit(repository: Path, commit: str) -> str:
    """The full id of `commit` (a prefix is enough); MirrorError when the repository lacks it."""
    try:
        return git(repository, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}").decode().strip()
    except MirrorError:
        raise MirrorError(f"commit {commit} is not in {repository}") from None


@dataclass(frozen=True)
class CommitTree:
    """One commit's files as an archive: `archive` (an uncompressed tar) and the regular files it holds."""

    archive: Path
    files: tuple[str, ...]

    def read(self, path: str) -> bytes | None:
        """The content of `path` at the commit, or None when the commit has no such regular file."""
        if path not in self.files:
            return None
        with tarfile.open(self.archive) as tar:
            member = tar.extractfile(path)
            return member.read() if member is not None else None

    def read_many(self, paths: list[str]) -> dict[str, bytes | None]:
        """The contents of several paths with one pass over the archive."""
        wanted, found = set(paths) & set(self.files), {}
        if wanted:
            with tarfile.open(self.archive) as tar:
                for member in tar:
                    if member.name in wanted and member.isreg() and (data := tar.extractfile(member)) is not None:
                        found[member.name] = data.read()
        return {path: found.get(path) for path in paths}


def commit_tree(mirror: Path, cache: Path, repo: str, commit: str) -> CommitTree:
    """The archive of `repo` at `commit`, made on first use and kept in `cache` (written atomically)."""
    folder = cache / repo.replace("/", "__")
    archive, listing = folder / f"{commit}.tar", folder / f"{commit}.json"
    if not (archive.is_file() and listing.is_file()):
        repository = repository_path(mirror, repo)
        full = resolve_commit(repository, commit)
        data = git(repository, "archive", "--format=tar", full)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            files = sorted(m.name for m in tar.getmembers() if m.isreg())
        folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(archive, data)
        _write_atomic(listing, json.dumps({"commit": full, "files": files}).encode())
    return CommitTree(archive, tuple(json.loads(listing.read_text())["files"]))


def _write_atomic(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, prefix=f".{path.name}.") as out:
        out.write(data)
    os.replace(out.name, path)
