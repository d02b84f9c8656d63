"""Run one command of a session: its own user, namespaces and process group, rlimits, a wall clock,
an output cap, and nothing of it left alive afterwards.

Isolated mode (the server runs as root, with no capability beyond SETUID, SETGID, CHOWN, DAC_OVERRIDE, FOWNER
and KILL): each command drops to the session's unprivileged uid with no supplementary groups and no_new_privs and
joins the session's namespaces, made once when the session opens (session_network.py): its user namespace, its
network namespace (only its loopback, or a guarded way out) and its mount namespace, where the session's own
/tmp, /var/tmp, /dev/shm and /run/lock lie over the host's and an empty read-only file system over each folder of
the server's installation and task store. Inside, the command gets a user namespace of its own whose uid is the
session's, without capabilities over those mounts or the network, with fresh mount, PID and IPC namespaces and a
/proc of its own, so it sees no process of another session. The shell is PID 1 of the PID namespace, so when it
exits, or when the server kills it, the kernel kills everything the command started (setsid daemons included)
and reaps it: no process outlives the command. Mounts are private to the namespace: nothing propagates back.
Without root, commands run as the server's user in their own process group (development only).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kuberl_sandbox.session_network import PRLIMIT, UNSHARE, SessionNetwork, as_user, join_argv
from kuberl_sandbox.settings import CommandLimits

_READ_CHUNK = 1 << 16
_DRAIN_GRACE_S = 0.05
_STOP_GRACE_S = 2.0

SHARED_SCRATCH: dict[str, str] = {"/tmp": "tmp", "/var/tmp": "var-tmp", "/dev/shm": "dev-shm", "/run/lock": "run-lock"}
"""The host's world-writable scratch folders, each with the name of the session's own copy in its private folder."""
FSTAB = "fstab"
"""Beside a session's private folder, in its root-owned home: what the session's mount namespace mounts, once,
when the session opens (`mount --all --fstab`, session_network.py). Readable, never writable, by the session:
the covers over hidden folders are in it."""
RESOLV_CONF = "resolv.conf"
"""Beside the fstab: the session's /etc/resolv.conf when it has egress."""
HIDDEN_OPTIONS = "ro,nosuid,nodev,noexec,size=4k,mode=0555"
"""What covers a hidden folder: an empty file system nothing can be written to or run from."""


@dataclass(frozen=True)
class Identity:
    """Who a session's commands run as. `isolated` is False when the server cannot switch users."""

    uid: int
    gid: int
    isolated: bool
    private: Path | None = None
    """Isolated only: the session's private folder (see `make_private_root`), an absolute path."""
    namespaces: int | None = None
    """Isolated only: the pid of the process holding the session's user and network namespaces."""
    own_network: bool = True
    """The holder has a network namespace of the session's own (always but in measurements of its cost)."""


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
        *command_argv(command, identity, limits, cwd),
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,  # its own process group, killed as one
    )
    output = _Output(limits.output_bytes)
    assert proc.stdout is not None
    reader, exited = asyncio.create_task(output.pump(proc.stdout)), asyncio.create_task(_process_exit(proc))
    overflowed = asyncio.create_task(output.overflow.wait())
    timed_out = False
    try:
        timed_out = await _wait_for_end(reader, exited, overflowed, output, limits.timeout_s, started)
    finally:
        await _reap(proc, identity, reader, exited, overflowed)
    killed = timed_out or output.truncated or proc.returncode is None or proc.returncode < 0
    text = output.kept.decode("utf-8", errors="replace")
    if killed and identity.isolated:
        # unshare reports its child's death on the same pipe; that line is ours, not the command's (the
        # mount script and setpriv have exec'd into the command by then, or print only when they fail)
        text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("unshare: "))
    return CommandResult(
        exit_code=None if killed else proc.returncode,
        output=text,
        truncated=output.truncated,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
    )


class _Output:
    """A command's output up to `cap` bytes; `overflow` is set once it produced more (it is then killed)."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.kept = bytearray()
        self.truncated = False
        self.overflow = asyncio.Event()

    async def pump(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(_READ_CHUNK):
            room = self.cap - len(self.kept)
            if len(chunk) > room:
                # Keep what fits, have the command killed, and read on (discarding) until the pipe
                # closes: a paused pipe would never report its end and the process never be waited for.
                self.kept.extend(chunk[: max(room, 0)])
                self.truncated = True
                self.overflow.set()
            else:
                self.kept.extend(chunk)


async def _wait_for_end(
    reader: asyncio.Task,
    exited: asyncio.Task,
    overflowed: asyncio.Task,
    output: _Output,
    timeout_s: float,
    started: float,
) -> bool:
    """Wait until the command ends, overflows its output or runs out of time (`timeout_s` after `started`);
    returns whether it timed out."""
    deadline = started + timeout_s
    await asyncio.wait({reader, exited, overflowed}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    if exited.done() and not reader.done() and not output.truncated:
        # The shell is gone but something it started still holds the pipe: read what is already
        # there; the leftovers are killed below (they must not outlive the command).
        await asyncio.wait(
            {reader, overflowed},
            timeout=min(_DRAIN_GRACE_S, max(0.0, deadline - time.monotonic())),
            return_when=asyncio.FIRST_COMPLETED,
        )
    elif reader.done() and not output.truncated:
        await asyncio.wait({exited}, timeout=max(0.0, deadline - time.monotonic()))
    return not exited.done() and not output.truncated


async def _reap(
    proc: asyncio.subprocess.Process,
    identity: Identity,
    reader: asyncio.Task,
    exited: asyncio.Task,
    overflowed: asyncio.Task,
) -> None:
    """Stop what is still running of the command, wait for it, and end the tasks that watched it."""
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


def command_argv(command: str, identity: Identity, limits: CommandLimits, cwd: str = "/") -> list[str]:
    """The argv that runs `command` through /bin/sh in `cwd` as `identity` under `limits`.

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
    if identity.private is None or not identity.private.is_absolute():
        raise ValueError("an isolated command needs the absolute path of its session's private folder")
    if identity.namespaces is None:
        raise ValueError("an isolated command needs its session's namespaces")
    # The session's namespaces (user, network, and its mount namespace with the private /tmp and the covers,
    # made once by the holder), then, in one unshare, the command's own: a user namespace nested in the session's
    # whose uid is the session's (no capability over the session's mounts or network, its firewall and interfaces,
    # survives into the command: its mounts are locked, the network is the holder's namespace's), with a mount
    # namespace (--propagation private: nothing made inside reaches the session's or the host's), a PID namespace
    # with a /proc of its own (--mount-proc: other sessions' processes are not even listed) and IPC (SysV shared
    # memory, semaphores and message queues of the command's own, gone with it).
    own = [
        UNSHARE,
        "--user",
        f"--map-user={identity.uid}",
        f"--map-group={identity.gid}",
        "--mount",
        "--propagation",
        "private",
        "--pid",
        "--ipc",
        "--fork",
        "--kill-child",
        "--mount-proc",
        "--",
    ]
    user = as_user(identity.uid, identity.gid)
    joined = join_argv(identity.namespaces, identity.own_network, cwd)
    return [*rlimits, *user, *joined, *own, *shell]


def make_private_root(
    private: Path,
    visible: Path,
    shared: tuple[Path, ...] = (),
    hidden: tuple[Path, ...] = (),
    owner: tuple[int, int] | None = None,
    resolver: str | None = None,
) -> None:
    """Make a session's private folder: one scratch folder per shared one of the host (`SHARED_SCRATCH`),
    and the fstab with which each command mounts them over the host's in its own mount namespace, then an empty
    read-only file system over each of the `hidden` folders.

    `private` is 0700 and the session's (`owner`): the session's namespace root mounts through it, no other
    session can reach it, even knowing the path. The fstab (beside it, `fstab_of`: its parent must be root's and
    not writable by the session) and the scratch folders are root's, those 1777 like
    the host's own (programs that check /tmp see what they expect; the sticky bit keeps the mount points below
    safe from the session's user).
    `visible` (the sandbox root: workspaces, scoring copies, the `python` shim) must stay reachable at its own
    path, and in local runs it lies under /tmp: it is then bind-mounted onto a mount point at the same place
    inside the private /tmp first. `private` must lie inside `visible` (its paths then resolve after every mount).
    `shared` are more folders that must stay reachable the same way (a prepared environment the session runs in).
    `resolver`: the name server the session's /etc/resolv.conf names (its user-mode stack's forwarder: the
    host's own may sit at an address the session must not reach).
    """
    visible, private = visible.resolve(), private.resolve()  # real paths: what mount and getcwd() see
    if not private.is_relative_to(visible):
        raise ValueError(f"private folder {private} is not inside {visible}")
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)  # whatever the umask
    if owner is not None:
        os.chown(private, *owner)
    first, then = [], []
    for target, name in _scratch_targets():
        own = private / name
        own.mkdir()
        os.chmod(own, 0o1777)
        if visible.is_relative_to(target):
            if visible == target:
                raise ValueError(f"the sandbox root cannot be {target} itself: sessions get a private {target}")
            first.append(_fstab_line(visible, _mount_point(own, visible.relative_to(target)), "bind"))
        for folder in (f.resolve() for f in shared):
            if folder.is_relative_to(target) and not folder.is_relative_to(visible):
                first.append(_fstab_line(folder, _mount_point(own, folder.relative_to(target)), "bind"))
        # rbind: the copy of `visible` mounted inside comes along
        then.append(_fstab_line(own, target, "rbind"))
    # a folder gone since the list was made needs no cover (and a mount on it would fail the session)
    covers = [f"tmpfs {_fstab_escape(folder)} tmpfs {HIDDEN_OPTIONS} 0 0\n" for folder in hidden if folder.is_dir()]
    if resolver is not None:
        resolv = private.parent / RESOLV_CONF
        resolv.write_text(f"nameserver {resolver}\n")
        os.chmod(resolv, 0o644)
        covers.append(_fstab_line(resolv, Path("/etc/resolv.conf"), "bind"))
    fstab = fstab_of(private)
    fstab.write_text("".join(first + then + covers))
    os.chmod(fstab, 0o644)  # read by the session's namespace root, which is the session's uid


def fstab_of(private: Path) -> Path:
    return private.parent / FSTAB


def _scratch_targets() -> list[tuple[Path, str]]:
    """The shared scratch folders this host has, as real paths, each once (/var/lock may be /run/lock, say).
    One it lacks needs no private copy, and a read-only root could not get a mount point for it anyway."""
    targets: dict[Path, str] = {}
    for path, name in SHARED_SCRATCH.items():
        real = Path(os.path.realpath(path))
        if real.is_dir() and real not in targets:
            targets[real] = name
    return list(targets.items())


def _mount_point(base: Path, relative: Path) -> Path:
    """`base/relative`, each folder made root's and 0755: in a sticky folder, the session's user can neither
    remove nor replace them (a link there would redirect root's mount)."""
    path = base
    for part in relative.parts:
        path = path / part
        path.mkdir(exist_ok=True)  # two folders mounted under one parent share its mount points
        os.chmod(path, 0o755)
    return path


def _fstab_line(source: Path, target: Path, option: str) -> str:
    return f"{_fstab_escape(source)} {_fstab_escape(target)} none {option} 0 0\n"


def _fstab_escape(path: Path) -> str:
    """fstab separates fields by white space; libmount reads octal escapes back."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in str(path))


def namespaces_available(uid: int) -> str | None:
    """Why this process cannot run commands as `command_argv` builds them, or None when it can: root with
    CAP_SETUID and CAP_SETGID, unprivileged user namespaces allowed (no sysctl, seccomp or AppArmor rule
    against them or against mount), util-linux unshare, nsenter, mount and setpriv, and iproute2. The whole
    argv is tried, in namespaces of its own, with a private folder under the temp dir."""
    if os.geteuid() != 0:
        return "the server does not run as root (it needs CAP_SETUID and CAP_SETGID to give sessions their uids)"
    probe = Path(tempfile.mkdtemp(prefix="kuberl-sandbox-probe-"))
    network = None
    try:
        os.chmod(probe, 0o711)
        make_private_root(probe / "private", visible=probe, owner=(uid, uid))
        fstab = fstab_of(probe / "private")
        network = SessionNetwork.open(uid, uid, CommandLimits().max_processes, fstab, egress=False)
        identity = Identity(uid=uid, gid=uid, isolated=True, private=probe / "private", namespaces=network.pid)
        result = subprocess.run(
            command_argv("true", identity, CommandLimits()), capture_output=True, timeout=10, cwd="/"
        )
    except (OSError, ValueError, RuntimeError, subprocess.SubprocessError) as err:
        return str(err)
    finally:
        if network is not None:
            network.close()
        shutil.rmtree(probe, ignore_errors=True)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).decode(errors="replace").strip()
        return f"a command in the session's namespaces failed (exit {result.returncode}): {output[-500:]}"
    return None


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
