"""Host-wide blocks of user ids: every sandbox server on a host gives its sessions uids no other server hands out.

Session uids are the sandbox's boundary between sessions (workspaces are 0700 to their uid, RLIMIT_NPROC counts
per uid). Servers count uids from the same base, so two servers on one host (`kuberl run` with several sandbox
replicas) would give one uid to two sessions, and each could read the other's files. A server therefore claims a
block of uids by holding an exclusive `flock` on that block's lock file in one host-wide folder, trying blocks in
order until one is free. The kernel drops the lock when the process dies, however it dies, so a crashed server
frees its block and no stale lock file ever needs cleaning up.

Servers on one host must agree on the base and the block size (the defaults of `SandboxSettings`): a lock names
one block, not a range of uids. Servers in different containers coordinate only if they share the lock folder;
pods on one node do not (give them different `uid_base`s, or user namespaces, where that matters).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

LOCK_DIRS: tuple[Path, ...] = (
    Path("/run/kuberl-sandbox/uid-blocks"),  # tmpfs, root's: the place for host-wide run-time state
    Path(tempfile.gettempdir()) / "kuberl-sandbox-uid-blocks",  # where /run is not writable
)


FIRST_NAMESPACED_UID = 10_000
NOBODY = 65_534


class NoFreeUidBlock(RuntimeError):
    """Every block is held by another live server on this host, or there is nowhere to keep the locks."""


@dataclass(frozen=True)
class UidBlock:
    """`size` uids from `first`, this process's alone while it holds the lock on `lock` (open as `fd`)."""

    first: int
    size: int
    lock: Path
    fd: int

    def uid(self, n: int) -> int:
        """The `n`th uid of the block, wrapping inside it."""
        return self.first + n % self.size

    def release(self) -> None:
        """Free the block now (it is freed anyway when the process exits)."""
        with contextlib.suppress(OSError):
            os.close(self.fd)


def mapped_blocks(base: int, size: int, count: int, uid_map: str | None = None) -> tuple[int, int, int]:
    """(base, size, count) of the blocks this process can hand out: as configured where its user namespace
    maps them all (the host's own namespace maps every id), else as many as fit in the largest mapped range.

    A pod with `hostUsers: false` maps only 65,536 ids (0-65535), far below the default base of 200,000:
    sessions there take ids from 10,000 up (above the image's system and login users) to 65,533 (65,534 is
    `nobody`). Each such pod has its own range of host ids, so its sessions cannot collide with another pod's.
    """
    text = uid_map if uid_map is not None else _read_uid_map()
    ranges = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 3 and all(f.isdigit() for f in fields):
            inside, _, length = map(int, fields)
            ranges.append((inside, inside + length))
    if not ranges or any(start <= base and base + size * count <= end for start, end in ranges):
        return base, size, count
    start, end = max(ranges, key=lambda r: r[1] - r[0])
    low = max(start, FIRST_NAMESPACED_UID if end - FIRST_NAMESPACED_UID > 4096 else 1000)
    high = min(end, NOBODY) if start <= NOBODY < end else end
    fitted = min(size, max(high - low, 0))
    return low, fitted, (high - low) // fitted if fitted else 0


def _read_uid_map() -> str:
    try:
        return Path("/proc/self/uid_map").read_text()
    except OSError:
        return ""


def claim_block(base: int, size: int, count: int, lock_dirs: Sequence[Path] = LOCK_DIRS) -> UidBlock:
    """The first of `count` blocks of `size` uids from `base` that no live process on this host holds."""
    if base <= 0 or size <= 0 or count <= 0:
        raise ValueError(f"uid blocks need a positive base, size and count, got {base}, {size}, {count}")
    folder = _lock_folder(lock_dirs)
    for index in range(count):
        first = base + index * size
        if (block := _try_lock(folder / f"uids-{first}-{size}.lock", first, size)) is not None:
            return block
    raise NoFreeUidBlock(
        f"all {count} blocks of {size} uids from {base} are held by other sandbox servers on this host "
        f"(locks in {folder}); stop one, or raise the number of blocks"
    )


def _try_lock(path: Path, first: int, size: int) -> UidBlock | None:
    # O_NOFOLLOW: a planted link must not make root create or truncate a file elsewhere
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    # who holds it, for whoever wonders which server uses which uids (the lock, not this, is what counts)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return UidBlock(first=first, size=size, lock=path, fd=fd)


def _lock_folder(candidates: Sequence[Path]) -> Path:
    """The first candidate folder that exists or can be made, and that only this user can change: in a
    world-writable place (the temp dir fallback) someone else could have made it first, to plant links or to
    hold every lock."""
    problems = []
    for folder in candidates:
        try:
            folder.mkdir(mode=0o755, parents=True, exist_ok=True)
            info = os.lstat(folder)
        except OSError as err:
            problems.append(f"{folder}: {err.strerror}")
            continue
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            problems.append(f"{folder}: not a folder of this user's that only it can write")
            continue
        return folder
    raise NoFreeUidBlock("nowhere to keep uid block locks: " + "; ".join(problems))
