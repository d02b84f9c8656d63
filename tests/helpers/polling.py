"""Waiting in tests for something another process does (an operator reconciling, a server starting)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    """Poll until `check` returns something truthy and return it; AssertionError naming `what` at `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")
