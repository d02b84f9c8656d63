"""A session's workspace on disk: the file tools, listings and checksums, on paths the agent controls.

The server is root and the workspace is the agent's: its commands can make links, FIFOs, files with
names that are not UTF-8, and could swap any path between two of the server's calls. So every
operation here, on top of the session's lock that its callers hold:

- runs with the session's file rights (`rights.session_rights`): the kernel refuses what the session's
  user could not do, so whatever a path turns out to point at, the server can do there only what the
  agent could; files it creates belong to the session without a `chown`;
- walks a path one name at a time from an open folder, each opened with O_NOFOLLOW: a link anywhere on
  the way is refused, never followed, whatever it points at (the `openat2(RESOLVE_NO_SYMLINKS)` rule);
- opens files with O_NONBLOCK and checks what it opened: only regular files are read or written, so a
  FIFO or a device cannot stall the server;
- checks sizes before doing work: a write or a replacement whose result would pass the limit is
  refused before anything is built or written.

Callers run these functions off the event loop (`asyncio.to_thread`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from kuberl_sandbox.rights import Owner, session_rights

MAX_PATH_BYTES = 4096
MAX_NAME_BYTES = 255
MAX_DEPTH = 128
"""Folders within folders that paths, listings, checksums and snapshots go through."""
MAX_LISTED = 10_000
"""Entries a listing returns at most (a workspace with a million files must not make a huge answer)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CHUNK = 1 << 20


class WorkspaceError(ValueError):
    """A request the workspace refuses; the message says why and is safe to show the caller."""


# ---------------------------------------------------------------------------------------------- paths
def path_names(relative: str | bytes) -> list[bytes]:
    """The names along `relative`, checked: relative, no '..', within the length limits, and (given as
    text, as the agent's calls give it) valid UTF-8. An empty list means the workspace itself ('.').
    Paths found on disk come as bytes: a name the agent's command made need not be UTF-8."""
    if not relative:
        raise WorkspaceError("path must be a non-empty path relative to the workspace")
    if isinstance(relative, str):
        try:
            relative = relative.encode("utf-8")
        except UnicodeEncodeError:
            raise WorkspaceError(f"path {_shown(relative)} is not valid UTF-8") from None
    if relative.startswith(b"/"):
        raise WorkspaceError(f"path must be relative to the workspace, got {_shown(relative)}")
    if b"\0" in relative:
        raise WorkspaceError(f"path {_shown(relative)} contains a NUL character")
    if len(relative) > MAX_PATH_BYTES:
        raise WorkspaceError(f"path is {len(relative)} bytes long; the limit is {MAX_PATH_BYTES}")
    names = [n for n in relative.split(b"/") if n not in (b"", b".")]
    if b".." in names:
        raise WorkspaceError(f"path {_shown(relative)} leads outside the workspace ('..' is not allowed)")
    if len(names) > MAX_DEPTH:
        raise WorkspaceError(f"path is {len(names)} names deep; the limit is {MAX_DEPTH}")
    if long := [n for n in names if len(n) > MAX_NAME_BYTES]:
        raise WorkspaceError(f"a name in the path is {len(long[0])} bytes long; the limit is {MAX_NAME_BYTES}")
    return names


def shown_name(name: bytes) -> str:
    """A name as text for the caller: bytes that are not UTF-8 appear as \\xNN escapes."""
    return name.decode("utf-8", errors="backslashreplace")


def _shown(relative: str | bytes) -> str:
    if isinstance(relative, str):
        relative = relative.encode("utf-8", errors="backslashreplace")
    return shown_name(relative[:200]).replace("\n", "\\n")


def _refusal(err: OSError, relative: str | bytes) -> WorkspaceError:
    """An OS error on the agent's path, as a message for the agent."""
    what = {
        errno.ENOENT: "no such file or folder",
        errno.ELOOP: "a link is on the way (file tools do not follow links)",
        errno.ENOTDIR: "a name on the way is not a folder",
        errno.EISDIR: "it is a folder",
        errno.EACCES: "permission denied",
        errno.EPERM: "permission denied",
        errno.ENAMETOOLONG: "the name is too long",
        errno.ENXIO: "it is not a regular file",
        errno.ENOSPC: "no space left",
        errno.EDQUOT: "no space left",
        errno.EFBIG: "the file is too large",
        errno.EEXIST: "it exists and is not a folder",
        errno.EROFS: "read-only",
    }.get(err.errno or 0, err.strerror or type(err).__name__)
    return WorkspaceError(f"{what}: {_shown(relative)}")


@contextmanager
def open_folder(workspace: Path, names: list[bytes], relative: str | bytes, create: bool = False) -> Iterator[int]:
    """An open descriptor of the folder at `names` inside `workspace`, reached without following a link;
    with `create`, missing folders are made on the way (as the caller's file rights: the session's)."""
    fd = os.open(workspace, _DIR_FLAGS)
    try:
        for name in names:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(name, 0o755, dir_fd=fd)
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except NotADirectoryError:
                if _is_link(name, fd):  # O_DIRECTORY answers a link with ENOTDIR: say which it was
                    raise OSError(errno.ELOOP, "link") from None
                raise
            os.close(fd)
            fd = inner
        yield fd
    except OSError as err:
        raise _refusal(err, relative) from None
    finally:
        os.close(fd)


def _is_link(name: bytes, folder: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _regular(fd: int, relative: str | bytes) -> os.stat_result:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise WorkspaceError(f"{_shown(relative)}: not a regular file (file tools read and write only those)")
    return info


def _read_all(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes of an open file."""
    chunks, left = [], limit
    while left > 0 and (chunk := os.read(fd, min(left, _CHUNK))):
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _file_names(relative: str | bytes) -> tuple[list[bytes], bytes]:
    names = path_names(relative)
    if not names:
        raise WorkspaceError(f"{_shown(relative)} is the workspace folder, not a file")
    return names[:-1], names[-1]


# ----------------------------------------------------------------------------------------- file tools
def read_bytes(workspace: Path, relative: str, limit: int, owner: Owner | None) -> tuple[bytes, bool]:
    """A regular file's first `limit` bytes, and whether there were more."""
    parents, name = _file_names(relative)
    with session_rights(owner), open_folder(workspace, parents, relative) as folder:
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=folder)
        except OSError as err:
            raise _refusal(err, relative) from None
        try:
            _regular(fd, relative)
            data = _read_all(fd, limit + 1)
        finally:
            os.close(fd)
    return data[:limit], len(data) > limit


def read_text(workspace: Path, relative: str, limit: int, owner: Owner | None) -> tuple[str, bool]:
    """File content (UTF-8, undecodable bytes replaced) and whether it was cut at `limit` bytes."""
    data, cut = read_bytes(workspace, relative, limit, owner)
    return data.decode("utf-8", errors="replace"), cut


def write_bytes(
    workspace: Path, relative: str | bytes, data: bytes, owner: Owner | None, limit: int, mode: int | None = None
) -> int:
    """Write a regular file (creating parent folders, setting `mode` if given); returns bytes written.
    Refused before anything is made when `data` is over `limit` bytes."""
    if len(data) > limit:
        raise WorkspaceError(f"{_shown(relative)}: {len(data)} bytes is over the file size limit of {limit}")
    parents, name = _file_names(relative)
    with session_rights(owner), open_folder(workspace, parents, relative, create=True) as folder:
        try:
            fd = os.open(name, _WRITE_FLAGS, 0o644, dir_fd=folder)
        except OSError as err:
            raise _refusal(err, relative) from None
        try:
            _regular(fd, relative)  # before truncating: never write into what is not a plain file
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if mode is not None:
                os.fchmod(fd, mode)
        except OSError as err:
            raise _refusal(err, relative) from None
        finally:
            os.close(fd)
    return len(data)


def write_text(workspace: Path, relative: str, content: str, owner: Owner | None, limit: int) -> int:
    return write_bytes(workspace, relative, _utf8(content, "content"), owner, limit)


def replace_text(workspace: Path, relative: str, old: str, new: str, owner: Owner | None, limit: int) -> int:
    """Replace every occurrence of `old` with `new`; returns how many there were (0 is an error). The
    result's size is worked out first: one over `limit` is refused before it is built."""
    if not old:
        raise WorkspaceError("old text must not be empty")
    old_bytes, new_bytes = _utf8(old, "old"), _utf8(new, "new")
    data, cut = read_bytes(workspace, relative, limit, owner)
    if cut:
        raise WorkspaceError(f"{_shown(relative)} is over the file size limit of {limit} bytes")
    count = data.count(old_bytes)
    if count == 0:
        raise WorkspaceError(f"old text not found in {_shown(relative)}")
    size = len(data) + count * (len(new_bytes) - len(old_bytes))
    if size > limit:
        raise WorkspaceError(
            f"replacing {count} occurrence(s) would make {_shown(relative)} {size} bytes, "
            f"over the file size limit of {limit}"
        )
    write_bytes(workspace, relative, data.replace(old_bytes, new_bytes), owner, limit)
    return count


def _utf8(text: str, field: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise WorkspaceError(f"{field} is not valid UTF-8 (a lone surrogate?)") from None


# -------------------------------------------------------------------------------------------- walking
@dataclass(frozen=True)
class Entry:
    """One thing in the workspace, found without following a link."""

    path: bytes
    """Relative to the workspace."""
    kind: str
    """'dir', 'file', 'link' or 'other' (FIFOs, sockets, devices: never opened)."""
    info: os.stat_result
    folder: int
    """An open descriptor of the folder holding it (valid while the walk is at this entry)."""
    name: bytes


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISREG(mode):
        return "file"
    return "link" if stat.S_ISLNK(mode) else "other"


def walk(folder: int, prefix: bytes = b"", depth: int = 0) -> Iterator[Entry]:
    """Every entry under the open folder `folder`, depth first, names sorted; links are reported, never
    followed, and a folder swapped for a link while walking is not entered. Folders nested deeper than
    MAX_DEPTH (a command can make thousands of levels) are refused, not walked."""
    if depth > MAX_DEPTH:
        raise WorkspaceError(f"folders are nested deeper than {MAX_DEPTH} levels at {_shown(prefix)}")
    names = sorted(os.fsencode(n) for n in os.listdir(folder))
    for name in names:
        try:
            info = os.stat(name, dir_fd=folder, follow_symlinks=False)
        except FileNotFoundError:
            continue
        entry = Entry(prefix + name, _kind(info.st_mode), info, folder, name)
        yield entry
        if entry.kind == "dir":
            try:
                inner = os.open(name, _DIR_FLAGS, dir_fd=folder)
            except OSError:
                continue  # gone, swapped for a link, or unreadable to the session: not entered
            try:
                yield from walk(inner, entry.path + b"/", depth + 1)
            finally:
                os.close(inner)


def read_entry(entry: Entry, limit: int) -> bytes:
    """A regular file's content from a walk (the file opened again without following a link). A file the
    session's own user cannot read (the agent's `chmod 0`) is refused by name: the server reads only what
    the session could."""
    try:
        fd = os.open(entry.name, _READ_FLAGS, dir_fd=entry.folder)
    except OSError as err:
        raise _refusal(err, entry.path) from None
    try:
        _regular(fd, entry.path)
        return _read_all(fd, limit)
    finally:
        os.close(fd)


def list_dir(workspace: Path, relative: str, owner: Owner | None) -> list[dict[str, object]]:
    """Entries of a folder, recursively, as {path, type, size}; at most MAX_LISTED."""
    names = path_names(relative)
    entries: list[dict[str, object]] = []
    with session_rights(owner), open_folder(workspace, names, relative) as folder:
        base = b"/".join(names) + b"/" if names else b""
        try:
            for entry in walk(folder, base):
                if len(entries) == MAX_LISTED:
                    break
                entries.append({"path": shown_name(entry.path), "type": entry.kind, "size": entry.info.st_size})
        except OSError as err:
            raise _refusal(err, relative) from None
    return entries


def search_text(
    workspace: Path, relative: str, needle: str, owner: Owner | None, max_matches: int, max_file_bytes: int
) -> tuple[list[tuple[str, int, str]], bool]:
    """Lines containing `needle` (a plain string, never a pattern: no expression of the agent's runs here) in the
    regular files under `relative`, as (path, line number, line); and whether more matches were left out.
    Files over `max_file_bytes` and files that are not UTF-8 text are skipped."""
    if not needle:
        raise WorkspaceError("the text to search for must not be empty")
    wanted, names = _utf8(needle, "text"), path_names(relative)
    found: list[tuple[str, int, str]] = []
    with session_rights(owner), open_folder(workspace, names, relative) as folder:
        base = b"/".join(names) + b"/" if names else b""
        try:
            for entry in walk(folder, base):
                if entry.kind != "file" or entry.info.st_size > max_file_bytes:
                    continue
                data = read_entry(entry, max_file_bytes)
                if wanted not in data or b"\0" in data[:1024]:
                    continue
                for number, line in enumerate(data.split(b"\n"), start=1):
                    if wanted in line:
                        if len(found) == max_matches:
                            return found, True
                        found.append((shown_name(entry.path), number, line.decode("utf-8", "replace")[:300]))
        except OSError as err:
            raise _refusal(err, relative) from None
    return found, False


def checksum(workspace: Path, owner: Owner | None) -> str:
    """SHA-256 over every entry's relative path, kind, permission bits and content (or link target)."""
    digest = hashlib.sha256()
    with session_rights(owner), open_folder(workspace, [], ".") as folder:
        try:
            for entry in walk(folder):
                digest.update(entry.path + b"\0" + oct(stat.S_IMODE(entry.info.st_mode)).encode() + b"\0")
                if entry.kind == "link":
                    digest.update(b"L" + os.readlink(entry.name, dir_fd=entry.folder))
                elif entry.kind == "file":
                    digest.update(b"F" + str(entry.info.st_size).encode() + b"\0")
                    digest.update(read_entry(entry, entry.info.st_size))
                else:
                    digest.update(b"D" if entry.kind == "dir" else b"O")
        except OSError as err:
            raise _refusal(err, ".") from None
    return digest.hexdigest()
