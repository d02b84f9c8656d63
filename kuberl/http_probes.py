"""HTTP probes as a kubelet makes them: a GET that must answer 200, on a fresh connection each time, and the
wait for a starting server to pass one. Used by `kuberl run`'s supervisor and by local servers' launchers."""

from __future__ import annotations

import functools
import subprocess
import time
from pathlib import Path

import httpx


@functools.cache
def _probe_client() -> httpx.Client:
    """One client for every probe of the process: a new client builds a TLS context (tens of milliseconds of
    CPU) even for plain http, which a probe every few hundred milliseconds turns into a share of a core. No
    pooled connection: a probe must not pass on a socket left from before its server restarted."""
    return httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def answers(url: str, timeout: float) -> bool:
    """Whether a GET of `url` answers 200 within `timeout` seconds."""
    try:
        return _probe_client().get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


def wait_until_ready(
    url: str, proc: subprocess.Popen, log: Path, timeout: float, name: str = "the server", interval: float = 0.2
) -> None:
    """Probe `url` every `interval` seconds until it answers 200; RuntimeError with the end of `log` if the
    process (`name` in messages) exits first, TimeoutError with it when `timeout` runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} while starting:\n{_tail(log)}")
        if answers(url, timeout=2.0):
            return
        time.sleep(interval)
    raise TimeoutError(f"{name} not ready after {timeout:.0f} s ({url}); the end of {log}:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.exists() else ""
