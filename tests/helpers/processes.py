"""Start the project's servers as real subprocesses on 127.0.0.1 for tests, and stop them by PID."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
KUBERL = str(REPO / ".venv" / "bin" / "kuberl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout}s:\n{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class SandboxServer:
    url: str
    token: str
    root: Path
    pid: int


@contextmanager
def sandbox_server(max_sessions: int = 2048, extra_env: dict[str, str] | None = None) -> Iterator[SandboxServer]:
    """A `kuberl sandbox` process with its own root folder (reachable by session users) and token."""
    root = Path(tempfile.mkdtemp(prefix="kuberl-sbx-", dir="/tmp"))
    os.chmod(root, 0o711)
    token, port = secrets.token_hex(16), free_port()
    log = root.parent / f"{root.name}.log"
    env = {**os.environ, "KUBERL_SANDBOX_TOKEN": token, **(extra_env or {})}
    argv = [KUBERL, "sandbox", "--host", "127.0.0.1", "--port", str(port), "--root", str(root / "sessions"),
            "--max-sessions", str(max_sessions)]  # fmt: skip
    with log.open("w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url + "/readyz", proc, log)
        yield SandboxServer(url=url, token=token, root=root / "sessions", pid=proc.pid)
    finally:
        stop(proc)
        subprocess.run(["rm", "-rf", str(root), str(log)], check=False)
