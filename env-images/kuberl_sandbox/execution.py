"""Run one command of a session: its own user, PID namespace and process group, rlimits, a wall clock,
an output cap, and nothing of it left alive afterwards.

Isolated mode (the server runs as root): each command runs through `unshare --pid --fork --kill-child`
as the session's own unprivileged uid. The shell is PID 1 of a fresh PID namespace, so when it exits,
or when the server kills `unshare`, the kernel kills everything the command started (setsid daemons
included) and reaps it: no process, and no zombie counting against RLIMIT_NPROC, outlives the command.
Without root, commands run as the server's user in their own process group (development only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from kuberl_sandbox.settings import CommandLimits

_READ_CHUNK = 1 << 16
_DRAIN_GRACE_S = 0.05
_STOP_GRACE_S = 2.0
UNSHARE = shutil.which("unshare") or "/usr/bin/unshare"
PRLIMIT = shutil.which("prlimit") or "/usr/bin/prlimit"


@dataclass(frozen=True)
class Identity:
    """Who a session's commands run as. `isolated` is False when the server cannot switch users."""

    uid: int
    gid: int
    isolated: bool


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    """Exit status; None when the command was killed."""
    output: str
    """stdout and stderr interleaved, cut at the output cap."""
    truncated: bool
    """More output was produced than kept (the command was killed for it)."""
    timed_out: bool
    """The wall-clock limit passed and the command was killed."""
    duration_s: float
    """Wall-clock seconds."""


async def run_command(
    command: str,
    *,
    cwd: str,
    env: dict[str, str],
    identity: Identity,
    limits: CommandLimits,
) -> CommandResult:
    """Run `command` through /bin/sh in `cwd` as `identity` under `limits`; never raises for what it does."""
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *command_argv(command, identity, limits),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed as one
    )
    kept = bytearray()
    truncated = timed_out = False
    deadline = started + limits.timeout_s

    overflow = asyncio.Event()

    async def pump() -> None:
        nonlocal truncated
        assert proc.stdout is not None
        while chunk := await proc.stdout.read(_READ_CHUNK):
            room = limits.output_bytes - len(kept)
            if len(chunk) > room:
                # Keep what fits, have the command killed, and read on (discarding) until the pipe
                # closes: a paused pipe would never report its end and the process never be waited for.
                kept.extend(chunk[: max(room, 0)])
                truncated = True
                overflow.set()
            else:
                kept.extend(chunk)

    reader, exited = asyncio.create_task(pump()), asyncio.create_task(_process_exit(proc))
    overflowed = asyncio.create_task(overflow.wait())
    try:
        await asyncio.wait({reader, exited, overflowed}, timeout=limits.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if exited.done() and not reader.done() and not truncated:
            # The shell is gone but something it started still holds the pipe: read what is already
            # there; the leftovers are killed below (they must not outlive the command).
            await asyncio.wait({reader, overflowed}, timeout=min(_DRAIN_GRACE_S, max(0.0, deadline - time.monotonic())),
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        elif reader.done() and not truncated:
            await asyncio.wait({exited}, timeout=max(0.0, deadline - time.monotonic()))
        timed_out = not exited.done() and not truncated
    finally:
        if not exited.done():
            await _stop(proc, identity, exited)
        if not identity.isolated:
            _kill_group(proc.pid)  # background leftovers of the process group
        await proc.wait()  # returns once the process is reaped and its pipe closed
        for task in (exited, overflowed):
            task.cancel()
        if not reader.done():
            reader.cancel()
        await asyncio.gather(reader, exited, overflowed, return_exceptions=True)
    killed = timed_out or truncated or proc.returncode is None or proc.returncode < 0
    output = kept.decode("utf-8", errors="replace")
    if killed and identity.isolated:
        # unshare reports its child's death on the same pipe; that line is ours, not the command's
        output = "".join(line for line in output.splitlines(keepends=True) if not line.startswith("unshare: "))
    return CommandResult(
        exit_code=None if killed else proc.returncode,
        output=output,
        truncated=truncated,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


def command_argv(command: str, identity: Identity, limits: CommandLimits) -> list[str]:
    """The argv that runs `command` through /bin/sh as `identity` under `limits`.

    rlimits are set by `prlimit` rather than a Python preexec_fn: without one, the server can spawn
    with vfork instead of copying its whole address space for every command.
    """
    rlimits = [
        PRLIMIT,
        f"--as={limits.memory_bytes}",
        f"--cpu={limits.cpu_seconds()}",
        f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_bytes}",
        f"--nofile={limits.max_open_files}",
        "--core=0",
        "--",
    ]
    shell = ["/bin/sh", "-c", command]
    if not identity.isolated:
        return rlimits + shell
    uid, gid = str(identity.uid), str(identity.gid)
    return [*rlimits, UNSHARE, "--pid", "--fork", "--kill-child", "--setuid", uid, "--setgid", gid, "--", *shell]


def namespaces_available(uid: int) -> bool:
    """Whether this process can run commands in PID namespaces as another user (root with CAP_SYS_ADMIN)."""
    if os.geteuid() != 0:
        return False
    try:
        argv = command_argv("true", Identity(uid=uid, gid=uid, isolated=True), CommandLimits())
        return subprocess.run(argv, capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


async def _stop(proc: asyncio.subprocess.Process, identity: Identity, exited: asyncio.Task[None]) -> None:
    """Kill a command that overran. Isolated: kill its namespace's PID 1, so `unshare` reaps it and exits
    (killing `unshare` first would orphan the shell as a zombie nobody reaps); then the group if needed."""
    if identity.isolated:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(child), signal.SIGKILL)
        if children:
            await asyncio.wait({exited}, timeout=_STOP_GRACE_S)
    if not exited.done():
        _kill_group(proc.pid)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _process_exit(proc: asyncio.subprocess.Process) -> None:
    """Wait for the process itself to exit. (`Process.wait()` also waits for every holder of its
    pipes to close it, which a background child can delay forever.)"""
    if proc.returncode is not None:
        return
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return  # already reaped
    loop = asyncio.get_running_loop()
    gone = loop.create_future()
    loop.add_reader(pidfd, lambda: gone.done() or gone.set_result(None))
    try:
        await gone
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)
