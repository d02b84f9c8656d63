"""A session's workspace on disk: safe path resolution, file tools, checksums and archives.

The server runs file operations itself (not as the session's user), so every path is resolved and
checked to stay inside the workspace, symlinks included. No session process outlives its command
(the executor kills them all), so nothing can swap a checked path for a symlink behind our back.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import stat
import tarfile
from pathlib import Path


class WorkspaceError(ValueError):
    """A request the workspace refuses; the message says why and is safe to show the caller."""


def resolve(workspace: Path, relative: str) -> Path:
    """The absolute path of `relative` inside `workspace`; refuses escapes by '..', absolute paths or links."""
    if not relative or relative.startswith("/") or "\x00" in relative:
        raise WorkspaceError(f"path must be relative to the workspace, got {relative!r}")
    candidate = workspace / relative
    real = Path(os.path.realpath(candidate))
    root = Path(os.path.realpath(workspace))
    if real != root and root not in real.parents:
        raise WorkspaceError(f"path {relative!r} leads outside the workspace")
    return real


def read_text(workspace: Path, relative: str, limit: int) -> tuple[str, bool]:
    """File content (UTF-8, undecodable bytes replaced) and whether it was cut at `limit` bytes."""
    path = resolve(workspace, relative)
    if not path.is_file():
        raise WorkspaceError(f"no such file: {relative}")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit


def write_text(workspace: Path, relative: str, content: str, owner: tuple[int, int] | None) -> int:
    """Write a file (creating parent folders) owned by the session user; returns bytes written."""
    path = resolve(workspace, relative)
    if path.is_dir():
        raise WorkspaceError(f"{relative} is a directory")
    created = _make_parents(workspace, path.parent, owner)
    data = content.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if owner:
        for p in [*created, path]:
            os.chown(p, *owner, follow_symlinks=False)
    return len(data)


def replace_text(workspace: Path, relative: str, old: str, new: str, owner: tuple[int, int] | None) -> int:
    """Replace every occurrence of `old` with `new`; returns how many there were (0 is an error)."""
    if not old:
        raise WorkspaceError("old text must not be empty")
    content, cut = read_text(workspace, relative, 16 << 20)
    if cut:
        raise WorkspaceError(f"{relative} is too large to edit")
    count = content.count(old)
    if count == 0:
        raise WorkspaceError(f"old text not found in {relative}")
    write_text(workspace, relative, content.replace(old, new), owner)
    return count


def list_dir(workspace: Path, relative: str = ".") -> list[dict[str, object]]:
    """Entries of a folder, recursively, as {path, type, size}; links are listed, never followed."""
    base = workspace if relative in ("", ".") else resolve(workspace, relative)
    if not base.is_dir():
        raise WorkspaceError(f"no such directory: {relative}")
    entries = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            full = Path(dirpath) / name
            info = full.lstat()
            kind = "link" if stat.S_ISLNK(info.st_mode) else "dir" if stat.S_ISDIR(info.st_mode) else "file"
            entries.append({"path": str(full.relative_to(workspace)), "type": kind, "size": info.st_size})
    return entries


def checksum(workspace: Path) -> str:
    """SHA-256 over every entry's relative path, kind, permission bits and content (or link target)."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = Path(dirpath) / name
            info = full.lstat()
            rel = str(full.relative_to(workspace)).encode()
            digest.update(rel + b"\0" + oct(stat.S_IMODE(info.st_mode)).encode() + b"\0")
            if stat.S_ISLNK(info.st_mode):
                digest.update(b"L" + os.readlink(full).encode())
            elif stat.S_ISREG(info.st_mode):
                digest.update(b"F" + str(info.st_size).encode() + b"\0")
                with full.open("rb") as f:
                    for chunk in iter(lambda: f.read(1 << 20), b""):
                        digest.update(chunk)
            else:
                digest.update(b"D")
    return digest.hexdigest()


def archive(workspace: Path) -> str:
    """The workspace as a base64 tar.gz (owners dropped: a restore assigns its own)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name in sorted(os.listdir(workspace)):
            tar.add(workspace / name, arcname=name, filter=_anonymous)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def extract(data: str, workspace: Path, owner: tuple[int, int] | None, max_bytes: int) -> None:
    """Unpack an archive made by `archive`; refuses links out of the workspace, devices and bombs."""
    try:
        raw = base64.b64decode(data, validate=True)
        with tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            members = tar.getmembers()
            if sum(m.size for m in members) > max_bytes:
                raise WorkspaceError(f"snapshot unpacks to more than {max_bytes} bytes")
            tar.extractall(workspace, filter="data")
    except (tarfile.TarError, ValueError, EOFError, OSError) as err:
        if isinstance(err, WorkspaceError):
            raise
        raise WorkspaceError(f"snapshot archive is unusable: {err}") from None
    if owner:
        for dirpath, dirnames, filenames in os.walk(workspace):
            for name in dirnames + filenames:
                os.chown(Path(dirpath) / name, *owner, follow_symlinks=False)


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0  # the same files give the same archive
    return info


def _make_parents(workspace: Path, folder: Path, owner: tuple[int, int] | None) -> list[Path]:
    missing = []
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        path.mkdir(mode=0o755)
    return list(reversed(missing))
