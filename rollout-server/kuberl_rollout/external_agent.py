"""Episodes played by an external agent (`spec.environment.agent`): the entry point gets the task, a recorded
session's OpenAI base URL and the sandbox session as an `AgentEnvironment` (whose `api_key` is the session's);
its model calls make the trajectory. It runs where the built-in `Agent.run` would (the service's episode slots,
timeouts, cancellation and metrics), and like it never raises for what the agent or the sandbox does: an agent
that raises makes a trajectory with finish reason `error` and the reason, which the learner leaves out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from kuberl.api.agents import AgentEntryPoint
from kuberl.api.environment import EnvironmentFailure, ScoredEnvironment, StepResult, Task, ToolCall
from kuberl.api.trajectory import FinishReason, Trajectory
from kuberl.modeling.chat import ChatFormat
from kuberl_rollout.agent import EpisodeLimits
from kuberl_rollout.environment_claim import claim_environment
from kuberl_rollout.environment_close import close_environment
from kuberl_rollout.recorded_sessions import RecordedSession, SessionStore


class TurnLimit(RuntimeError):
    """The episode used its `environment.maxTurns` tool calls; raised into the agent by the next one."""


class EpisodeEnvironment:
    """The sandbox session as an external agent sees it (`kuberl.api.agents.AgentEnvironment`): tool calls
    within the job's turn timeout and turn limit, their intermediate rewards recorded on the session's turns."""

    def __init__(
        self,
        env: ScoredEnvironment,
        observation: str,
        session: RecordedSession,
        limits: EpisodeLimits,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self._env, self._observation, self._session, self._limits = env, observation, session, limits
        self._observe = observe
        self.steps = 0
        self._done = False

    @property
    def observation(self) -> str:
        return self._observation

    @property
    def done(self) -> bool:
        return self._done

    @property
    def api_key(self) -> str:
        return self._session.api_key

    async def step(self, action: ToolCall) -> StepResult:
        if self._done:
            raise RuntimeError("the episode is over: the agent already submitted")
        if self.steps >= self._limits.max_turns:
            raise TurnLimit(f"the episode's {self._limits.max_turns} tool calls are used (environment.maxTurns)")
        self.steps += 1
        started = time.monotonic()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that arrives as the
            # call finishes (agent.py says more)
            async with asyncio.timeout(self._limits.turn_timeout_s):
                result = await self._env.step(action)
        finally:
            seconds = time.monotonic() - started
            self._session.timings["environment"] += seconds
            if self._observe is not None:
                self._observe("environment", seconds)
        self._done = result.done
        self._session.reward_last_turn(None if result.done else result.reward, action.name)
        return result

    async def call(self, name: str, **arguments: Any) -> StepResult:
        return await self.step(ToolCall(name=name, arguments=arguments))

    async def run(self, command: str) -> StepResult:
        return await self.call("run", command=command)

    async def run_tests(self) -> StepResult:
        return await self.call("run_tests")

    async def submit(self) -> StepResult:
        return await self.call("submit")


@dataclass
class ExternalAgent:
    """Runs episodes with an external entry point; `run` has the built-in `Agent.run`'s signature."""

    entry_point: AgentEntryPoint
    name: str
    """`module:function`, for error messages."""
    sessions: SessionStore
    server_url: str
    """This server's own URL, as the agent reaches it (the session base URLs start with it)."""
    chat: ChatFormat
    limits: EpisodeLimits
    observe: Callable[[str, float], None] | None = None

    async def run(self, env: ScoredEnvironment, task: Task, group_id: str, seed: int | None = None) -> Trajectory:
        """One episode of `task`; never raises for what the agent or the sandbox does (cancellation aside)."""
        session = self.sessions.open(self.server_url, task, group_id, self.limits.max_tokens, episode=True)
        finish, error = FinishReason.SUBMITTED, None
        handle: EpisodeEnvironment | None = None
        try:
            await claim_environment(env, task)  # waiting for an image's pool is not the episode's time
            async with asyncio.timeout(self.limits.trajectory_timeout_s):
                started = time.monotonic()
                async with asyncio.timeout(self.limits.turn_timeout_s):
                    observation = await env.reset(task)
                session.timings["environment"] += time.monotonic() - started
                handle = EpisodeEnvironment(env, observation, session, self.limits, self.observe)
                await self.entry_point(task, session.base_url, handle)
            if not handle.done and session.reward is None:
                finish = FinishReason.MAX_TURNS  # returned without submitting: scored like a cut-off episode
        except TurnLimit:
            finish = FinishReason.MAX_TURNS
        except TimeoutError:
            finish = FinishReason.TIMEOUT
        except (EnvironmentFailure, httpx.HTTPError) as err:
            finish, error = FinishReason.ERROR, f"{type(err).__name__}: {err}"
        except Exception as err:  # the agent's own failure: this episode's, not the server's
            finish, error = FinishReason.ERROR, f"agent {self.name} raised {type(err).__name__}: {err}"
        finally:
            if not session.closed:
                self.sessions.close(session)
            sandbox_session = env.session_id
            await close_environment(env)
        if finish == FinishReason.ERROR:
            reward = 0.0
        else:
            reward = session.reward if session.reward is not None else env.final_reward()
        fallback = self.chat.prompt_ids([{"role": "user", "content": task.prompt}])
        return session.trajectory(
            reward,
            finish,
            fallback,
            resolved=env.resolved(),
            tampering=env.tampering(),
            error=error,
            sandbox_session_id=sandbox_session,
        )
