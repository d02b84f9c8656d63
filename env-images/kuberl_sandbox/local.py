"""Run a sandbox server as a local subprocess: for `kuberl run`, benchmarks and tests."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kuberl.api import env_vars
from kuberl.api.command_lines import cli, sandbox_server_args
from kuberl.http_probes import wait_until_ready
from kuberl_sandbox.settings import ADVERTISE_ENV


@dataclass(frozen=True)
class SandboxEndpoint:
    url: str
    token: str
    root: Path
    pid: int


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_LISTEN_PORT = 10_000


def free_port() -> int:
    """A port free on 127.0.0.1 now, for a server started next, drawn below the kernel's ephemeral range. A port
    the kernel hands out (a bind to port 0) is one it hands to the next outgoing connection or port-0 listener too
    (vLLM's own sockets, any HTTP client): the server started a second later found it taken."""
    ephemeral = _first_ephemeral_port()
    if ephemeral - LOWEST_LISTEN_PORT >= 1000:
        for _ in range(100):
            port = LOWEST_LISTEN_PORT + secrets.randbelow(ephemeral - LOWEST_LISTEN_PORT)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:  # no room below the ephemeral range: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _first_ephemeral_port() -> int:
    try:
        return int(EPHEMERAL_PORTS.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


@contextmanager
def local_sandbox(
    max_sessions: int = 2048,
    ready_timeout: float = 30.0,
    session_timeout: str = "30m",
    token: str | None = None,
    launcher: Sequence[str] = (),
    extra_groups: Sequence[int] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[SandboxEndpoint]:
    """A `kuberl sandbox` process on 127.0.0.1 with a fresh root folder and token (or the one given: servers
    of one job share it), advertising its own URL, stopped on exit. `launcher` is put before the command
    (tests start it with fewer capabilities, or in a user namespace); `extra_groups` are given to the process;
    `env` adds to its environment (KUBERL_SANDBOX_EGRESS, say)."""
    base = Path(tempfile.mkdtemp(prefix="kuberl-sbx-", dir="/tmp"))  # /tmp: reachable by session users
    os.chmod(base, 0o711)
    token, port = token or secrets.token_hex(16), free_port()
    log = base / "server.log"
    env = {**os.environ, **(env or {}), env_vars.SANDBOX_TOKEN: token, ADVERTISE_ENV: f"http://127.0.0.1:{port}"}
    root = str(base / "sessions")
    argv = [*launcher, *cli(sys.executable), "sandbox"]
    argv += sandbox_server_args("127.0.0.1", port, root, session_timeout, max_sessions)
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, extra_groups=extra_groups)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", proc, log, ready_timeout)
        yield SandboxEndpoint(url=url, token=token, root=base / "sessions", pid=proc.pid)
    finally:
        _stop(proc)
        shutil.rmtree(base, ignore_errors=True)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
