"""The source distributions the tests make repositories from: fetched by pip once per checkout (the factory's own
`fetch_sdist`, into .cache/sdists), then unpacked by each test into its own folder."""

from __future__ import annotations

import fcntl
from pathlib import Path

from kuberl.swebench.factory.packages import fetch_sdist, parse_requirement

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "sdists"


def sdist(package: str, version: str) -> Path:
    """The archive of package==version (one download at a time: the test workers share the cache)."""
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    with (CACHE.parent / "sdists.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return fetch_sdist(parse_requirement(f"{package}=={version}"), CACHE)
