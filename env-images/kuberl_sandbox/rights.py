"""File operations with a session's rights: the server's thread switches its file-system uid and gid.

The server runs as root so that it can give sessions users of their own, but it must never use root's
rights on a file the agent can name, swap or link. Linux keeps a file-system uid and gid per *thread*
(`setfsuid(2)`, `setfsgid(2)`; the glibc wrappers are plain system calls, not broadcast to every thread
as `setuid` is): while they are the session's, the kernel checks every open, create and unlink against
the session's user, and drops the thread's file capabilities (CAP_DAC_OVERRIDE, CAP_CHOWN, CAP_FOWNER
and the rest), so whatever a race or a link makes a path point at, the server can do there only what the
agent itself could. Files it creates belong to the session without a `chown`. This is how NFS servers
act for their clients.

Use it on a worker thread (`asyncio.to_thread`), never on the event loop's thread, and only around one
operation: the `with` block restores root's file rights before the thread runs anything else.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

Owner = tuple[int, int]
"""A session's (uid, gid)."""

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_CURRENT = ctypes.c_uint(0xFFFFFFFF)
"""An invalid id: the call changes nothing and returns the current value."""


class RightsError(RuntimeError):
    """The thread's file rights could not be switched; nothing was done with them."""


def file_uid() -> int:
    return int(_libc.setfsuid(_CURRENT))


def file_gid() -> int:
    return int(_libc.setfsgid(_CURRENT))


@contextmanager
def session_rights(owner: Owner | None) -> Iterator[None]:
    """Run the block's file operations as `owner` (None: with the process's own rights, unchanged)."""
    if owner is None:
        yield
        return
    uid, gid = owner
    saved_uid, saved_gid = file_uid(), file_gid()
    _libc.setfsgid(ctypes.c_uint(gid))  # the gid first: changing it needs CAP_SETGID, dropped with the uid
    _libc.setfsuid(ctypes.c_uint(uid))
    try:
        if (file_uid(), file_gid()) != (uid, gid):
            raise RightsError(f"could not take the file rights of uid {uid}, gid {gid}")
        yield
    finally:
        _libc.setfsuid(ctypes.c_uint(saved_uid))
        _libc.setfsgid(ctypes.c_uint(saved_gid))
        if (file_uid(), file_gid()) != (saved_uid, saved_gid):
            # A thread left with the wrong rights would do the next session's work as this one: stop.
            os.abort()


def drop_supplementary_groups() -> None:
    """The file-system ids switch per thread, the supplementary groups do not: a root server drops its
    own (root needs none), so that no group of the server's grants a session's file operation anything."""
    if os.geteuid() == 0:
        os.setgroups([])
