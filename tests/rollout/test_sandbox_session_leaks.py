"""No sandbox session outlives its episode: not when the episode is cancelled while the session opens (the
learner cancels the groups it no longer needs), and not when the server is full for a moment.

A leaked session holds one of the server's `--max-sessions` places until the idle timeout (minutes): in the
demo, the cancelled groups of each step leaked a few, and from step 104 on new episodes were refused with
503 and 80 of 329 evaluation episodes failed."""

from __future__ import annotations

import asyncio

import httpx

from kuberl.suites.swe_toy import generate
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_sandbox.local import local_sandbox

TASK = generate(1, seed=3)[0]


def _no_reward(context):
    return None


async def _open_sessions(url: str) -> int:
    async with httpx.AsyncClient() as http:
        return (await http.get(url + "/readyz")).json()["sessions"]


async def _settled(url: str, expected: int, within_s: float = 10.0) -> int:
    """The server's open sessions once they reach `expected` (or what they are after `within_s`)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while (count := await _open_sessions(url)) != expected and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
    return count


def test_episodes_cancelled_while_their_sessions_open_leave_none_behind():
    async def cancel_while_opening(url: str, token: str) -> int:
        client = SandboxClient(url, token)
        # cancelled before the request is sent, while the server writes the files, and after it answered
        for delay in [0.0, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128] * 3:
            env = SandboxEnvironment(client, _no_reward)
            opening = asyncio.create_task(env.reset(TASK))
            await asyncio.sleep(delay)
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            if env.session_id is not None:  # it opened before the cancel: the episode's own close applies
                await env.close()
        left = await _settled(url, 0)
        await client.aclose()
        return left

    with local_sandbox() as server:
        assert asyncio.run(cancel_while_opening(server.url, server.token)) == 0


def test_a_full_server_makes_a_new_episode_wait_for_a_place_rather_than_fail():
    async def open_past_the_limit(url: str, token: str) -> tuple[int, int]:
        client = SandboxClient(url, token)
        holders = [SandboxEnvironment(client, _no_reward) for _ in range(2)]
        for env in holders:
            await env.reset(TASK)
        late = SandboxEnvironment(client, _no_reward)
        opening = asyncio.create_task(late.reset(TASK))
        await asyncio.sleep(1.0)
        waited = not opening.done()
        await holders[0].close()  # a place frees up: the waiting episode takes it
        await asyncio.wait_for(opening, timeout=10)
        opened = late.session_id is not None
        for env in (holders[1], late):
            await env.close()
        await client.aclose()
        return waited, opened

    with local_sandbox(max_sessions=2) as server:
        waited, opened = asyncio.run(open_past_the_limit(server.url, server.token))
    assert waited and opened
