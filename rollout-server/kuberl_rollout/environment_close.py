"""Closing an episode's environment, one rule for every agent loop: an episode that ends waits for its
environment to close (so its sandbox place is free before the slot takes the next episode); an episode that
was cancelled (a weight update's drain timeout, its group cancelled) hands the close to the background and ends
at once, so the weight update it holds up does not also wait for a killed test run to be reaped."""

from __future__ import annotations

import asyncio
import logging

import httpx

from kuberl.api.environment import Environment, EnvironmentFailure

log = logging.getLogger(__name__)

CLOSE_TIMEOUT_S = 10.0
"""The longest a close is waited for; the sandbox server reaps idle sessions itself after that."""

_closing: set[asyncio.Task[None]] = set()  # background closes (held: the loop keeps only weak references)


async def close_environment(env: Environment) -> None:
    """Close `env` within `CLOSE_TIMEOUT_S`; in the background when the calling task is being cancelled."""
    if asyncio.current_task().cancelling():
        task = asyncio.get_running_loop().create_task(_close(env))
        _closing.add(task)
        task.add_done_callback(_closing.discard)
        return
    await _close(env)


async def closes_in_background() -> None:
    """Wait for this event loop's closes handed to the background (a server shutting down, a test); each is
    bounded by `CLOSE_TIMEOUT_S`. Another loop's (one that ended with a close still pending: a test's) never
    finish and are dropped."""
    loop = asyncio.get_running_loop()
    for task in [t for t in _closing if t.get_loop() is not loop and t.get_loop().is_closed()]:
        _closing.discard(task)
    mine = {t for t in _closing if t.get_loop() is loop}
    if mine:
        await asyncio.wait(mine, timeout=CLOSE_TIMEOUT_S + 1)


async def _close(env: Environment) -> None:
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await env.close()
    except (EnvironmentFailure, httpx.HTTPError, TimeoutError) as err:  # the sandbox reaps idle ones
        log.debug("closing an environment failed (%s): the sandbox reaps it", type(err).__name__)
