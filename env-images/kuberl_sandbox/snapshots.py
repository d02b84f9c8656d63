"""Snapshots of a workspace: a tar.gz made and unpacked without `tarfile`'s extraction, and sealed with a MAC.

A snapshot carries files the agent made and travels through callers, so restoring one is handling
untrusted input as root. `tarfile.extractall` resolves member paths with `os.path.realpath` and then
writes through them; its "data" filter was bypassed by symlink chains longer than PATH_MAX
(CVE-2025-4517), and the server's Python may predate the fix. So nothing here follows a link: every member
is written through the workspace's O_NOFOLLOW walk with the session's file rights (see workspace.py), a
member whose path passes through a link is refused, and only folders, regular files and links that stay
inside the workspace are accepted.

The MAC (HMAC-SHA256 under a key only the job's sandbox servers hold) covers the task, the workspace
checksum and the archive, so only a server can mint a snapshot that a server will restore.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import io
import os
import posixpath
import stat
import tarfile
from pathlib import Path

from kuberl_sandbox import workspace as ws
from kuberl_sandbox.rights import Owner, session_rights

MAX_MEMBERS = 100_000
_MAC_CONTEXT = b"kuberl sandbox snapshot mac v1"


# ----------------------------------------------------------------------------------------------- MAC
def snapshot_key(token: str) -> bytes:
    """The MAC key of every sandbox server that shares `token` (all of one job's): derived, not the token
    itself, so a MAC never helps anyone guess the token."""
    return hmac.new(token.encode(), _MAC_CONTEXT, hashlib.sha256).digest()


def seal(key: bytes, task_id: str, checksum: str, data: str) -> str:
    """The MAC of a snapshot's task, workspace checksum and archive."""
    message = b"\0".join([task_id.encode(), checksum.encode(), hashlib.sha256(data.encode()).digest()])
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def is_sealed(key: bytes, task_id: str, checksum: str, data: str, mac: str) -> bool:
    return hmac.compare_digest(seal(key, task_id, checksum, data), mac)


# ------------------------------------------------------------------------------------------- archive
def archive(workspace: Path, owner: Owner | None, max_file_bytes: int) -> str:
    """The workspace as a base64 tar.gz: folders, regular files and links (FIFOs, sockets left out), owners
    and times dropped, so the same files give the same archive."""
    buffer = io.BytesIO()
    with (
        session_rights(owner),
        ws.open_folder(workspace, [], ".") as folder,
        tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar,
    ):
        for entry in ws.walk(folder):
            info = tarfile.TarInfo(os.fsdecode(entry.path))
            info.mode = stat.S_IMODE(entry.info.st_mode) & 0o777
            if entry.kind == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, os.fsdecode(os.readlink(entry.name, dir_fd=entry.folder))
                tar.addfile(info)
            elif entry.kind == "file":
                data = ws.read_entry(entry, max_file_bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def extract(data: str, workspace: Path, owner: Owner | None, max_bytes: int, max_file_bytes: int) -> None:
    """Unpack an archive made by `archive` into the (empty) workspace with the session's file rights.
    Refuses links out of the workspace, hard links, devices, FIFOs, paths through links, and bombs."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise ws.WorkspaceError("snapshot archive is unusable: not base64") from None
    total = members = 0
    try:
        with session_rights(owner), tarfile.open(fileobj=io.BytesIO(raw), mode="r:gz") as tar:
            for member in tar:
                members += 1
                total += max(member.size, 0)
                if members > MAX_MEMBERS or total > max_bytes:
                    raise ws.WorkspaceError(f"snapshot unpacks to more than {max_bytes} bytes or {MAX_MEMBERS} entries")
                _unpack(tar, member, workspace, max_file_bytes)
    except (tarfile.TarError, EOFError, OSError, UnicodeError) as err:
        raise ws.WorkspaceError(f"snapshot archive is unusable: {err}") from None


def _unpack(tar: tarfile.TarFile, member: tarfile.TarInfo, workspace: Path, max_file_bytes: int) -> None:
    raw = os.fsencode(member.name)  # the name's bytes as archived: they need not be UTF-8
    names = ws.path_names(raw) if member.name not in ("", ".") else []
    mode = member.mode & 0o777
    if member.isdir():
        if names:
            with ws.open_folder(workspace, names, raw, create=True) as folder:
                os.fchmod(folder, mode | 0o700)
        return
    if not names:
        raise ws.WorkspaceError(f"snapshot member {member.name!r} is not a file name")
    if member.issym():
        _check_link(member.name, member.linkname)
        with ws.open_folder(workspace, names[:-1], raw, create=True) as folder:
            os.symlink(os.fsencode(member.linkname), names[-1], dir_fd=folder)
        return
    if not member.isreg():
        raise ws.WorkspaceError(f"snapshot member {member.name!r} is not a folder, a regular file or a link")
    source = tar.extractfile(member)
    content = source.read(max_file_bytes + 1) if source else b""
    ws.write_bytes(workspace, raw, content, None, max_file_bytes, mode)  # rights: already the session's


def _check_link(name: str, target: str) -> None:
    """A link must point inside the workspace, judged on its text alone (it is never followed here)."""
    if not target or target.startswith("/") or "\0" in target:
        raise ws.WorkspaceError(f"snapshot link {name!r} points outside the workspace ({target!r})")
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
    if resolved == ".." or resolved.startswith("../"):
        raise ws.WorkspaceError(f"snapshot link {name!r} points outside the workspace ({target!r})")


# ------------------------------------------------------------------------------------------ scratch
def copy_workspace(workspace: Path, scratch: Path, owner: Owner | None, max_file_bytes: int) -> None:
    """Copy the workspace into a new folder `scratch` (whose parent the session owns), as the session."""
    with session_rights(owner):
        try:
            os.mkdir(scratch, 0o700)
        except OSError as err:
            raise ws.WorkspaceError(f"cannot make the scratch folder: {err.strerror}") from None
        with ws.open_folder(workspace, [], ".") as folder:
            for entry in ws.walk(folder):
                names, mode = ws.path_names(entry.path), stat.S_IMODE(entry.info.st_mode) & 0o777
                if entry.kind == "dir":
                    with ws.open_folder(scratch, names, entry.path, create=True) as copy:
                        os.fchmod(copy, mode | 0o700)
                elif entry.kind == "file":
                    content = ws.read_entry(entry, max_file_bytes)
                    ws.write_bytes(scratch, entry.path, content, None, max_file_bytes, mode)
                elif entry.kind == "link":
                    with ws.open_folder(scratch, names[:-1], entry.path) as parent:
                        os.symlink(os.readlink(entry.name, dir_fd=entry.folder), names[-1], dir_fd=parent)
