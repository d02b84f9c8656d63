"""A cancelled episode stops where it is, and does not wait for its sandbox session to close. The learner
cancels stale groups and the server cancels each of their episodes: one that went on would hold a sandbox
session and the engine for nothing. Python 3.11's `asyncio.wait_for` returned the result of a step that
finished as the cancellation arrived, and the episode took its next turn. A weight update's drain timeout
cancels the episodes still running and waits for them to stop: when each also waited for its sandbox to reap
a killed test run (up to 10 s), that was the update's median wait."""

from __future__ import annotations

import asyncio

import pytest
from test_trajectory_tampering import TASK, CharTokenizer, ScriptedClient, ScriptedEngine

from kuberl.api.environment import StepResult, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.environment_close import closes_in_background
from kuberl_rollout.sandbox_client import SandboxEnvironment


class SignallingClient(ScriptedClient):
    """Says when a step is being answered; the answer itself needs no wait."""

    def __init__(self, results: list[StepResult]) -> None:
        super().__init__(results)
        self.stepping = asyncio.Event()

    async def step(self, session_id: str, action: ToolCall) -> StepResult:
        self.stepping.set()
        return await super().step(session_id, action)


class AnsweringLaterEngine(ScriptedEngine):
    """A real engine answers on a later turn of the event loop."""

    async def generate(self, prompt_ids, max_tokens, **sampling):
        await asyncio.sleep(0)
        return await super().generate(prompt_ids, max_tokens, **sampling)


async def test_an_episode_cancelled_as_its_step_finishes_is_cancelled():
    results = [StepResult(observation="ran"), StepResult(observation="ran"), StepResult(observation="x", done=True)]
    client = SignallingClient(results)
    calls = [ToolCall(name="run_tests"), ToolCall(name="run_tests"), ToolCall(name="submit")]
    agent = Agent(
        AnsweringLaterEngine(calls),
        ChatFormat(CharTokenizer()),
        "fix it",
        EpisodeLimits(max_tokens=100_000, max_tokens_per_turn=1000),
    )
    episode = asyncio.create_task(agent.run(SandboxEnvironment(client, lambda ctx: 0.0), TASK, group_id="g1"))
    await client.stepping.wait()  # woken in the same turn of the loop in which the first step is answered
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    assert len(client.results) == 2  # no step after the cancelled one


class SlowClosingClient(SignallingClient):
    """A session whose step runs until cancelled and whose close takes `close_s` (a sandbox reaping a test run)."""

    def __init__(self, close_s: float) -> None:
        super().__init__([StepResult(observation="x", done=True)])
        self.close_s = close_s
        self.closed: list[str] = []

    async def step(self, session_id: str, action: ToolCall) -> StepResult:
        self.stepping.set()
        if action.name == "run_tests":
            await asyncio.sleep(3600)
        return await super().step(session_id, action)

    async def close(self, session_id: str) -> None:
        await asyncio.sleep(self.close_s)
        self.closed.append(session_id)


def _agent(calls: list[ToolCall]) -> Agent:
    return Agent(
        AnsweringLaterEngine(calls),
        ChatFormat(CharTokenizer()),
        "fix it",
        EpisodeLimits(max_tokens=100_000, max_tokens_per_turn=1000),
    )


async def test_a_cancelled_episode_ends_at_once_and_its_session_still_closes():
    client = SlowClosingClient(close_s=1.0)
    episode = asyncio.create_task(
        _agent([ToolCall(name="run_tests")]).run(SandboxEnvironment(client, lambda ctx: 0.0), TASK, group_id="g1")
    )
    await client.stepping.wait()
    started = asyncio.get_running_loop().time()
    episode.cancel()
    with pytest.raises(asyncio.CancelledError):
        await episode
    assert asyncio.get_running_loop().time() - started < 0.5  # not the 1 s close
    assert client.closed == []
    await closes_in_background()
    assert client.closed == ["s1"]


async def test_an_episode_that_ends_waits_for_its_session_to_close():
    client = SlowClosingClient(close_s=0.3)
    trajectory = await _agent([ToolCall(name="submit")]).run(
        SandboxEnvironment(client, lambda ctx: 1.0), TASK, group_id="g1"
    )
    assert client.closed == ["s1"]  # closed before the episode's slot takes the next one
    assert trajectory.final_reward == 1.0


def test_a_close_left_pending_by_an_ended_event_loop_does_not_hold_the_next_loops_shutdown():
    async def cancel_and_leave(client: SlowClosingClient) -> None:
        episode = asyncio.create_task(
            _agent([ToolCall(name="run_tests")]).run(SandboxEnvironment(client, lambda ctx: 0.0), TASK, group_id="g")
        )
        await client.stepping.wait()
        episode.cancel()
        await asyncio.gather(episode, return_exceptions=True)

    async def shut_down() -> float:
        started = asyncio.get_running_loop().time()
        await asyncio.wait_for(closes_in_background(), timeout=5)
        return asyncio.get_running_loop().time() - started

    ended = asyncio.new_event_loop()  # a loop closed with the close still pending (not asyncio.run's clean-up)
    ended.run_until_complete(cancel_and_leave(SlowClosingClient(close_s=3600)))
    ended.close()
    assert asyncio.run(shut_down()) < 1.0
