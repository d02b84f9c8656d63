"""A cancelled episode stops where it is. The learner cancels stale groups and the server cancels each of
their episodes: one that went on would hold a sandbox session and the engine for nothing. Python 3.11's
`asyncio.wait_for` returned the result of a step that finished as the cancellation arrived, and the episode
took its next turn."""

from __future__ import annotations

import asyncio

import pytest
from test_trajectory_tampering import TASK, CharTokenizer, ScriptedClient, ScriptedEngine

from kuberl.api.environment import StepResult, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl_rollout.agent import Agent, EpisodeLimits
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
