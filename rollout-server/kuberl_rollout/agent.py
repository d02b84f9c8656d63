"""The multi-turn agent loop: generate, parse a tool call, run it in the sandbox, append the observation
as tokens, until submit or a limit; then score. Token ids are kept end to end."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kuberl.api.environment import EnvironmentFailure, ScoredEnvironment, Task
from kuberl.api.trajectory import NOT_GENERATED, FinishReason, Trajectory, Turn
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import ParseError, parse_tool_call
from kuberl_rollout.engine import RolloutEngine
from kuberl_rollout.environment_claim import claim_environment
from kuberl_rollout.environment_close import close_environment
from kuberl_rollout.sandbox_client import SandboxError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EpisodeLimits:
    """Limits of one episode (from the RLJob's environment section) and the sampling settings."""

    max_turns: int = 16
    max_tokens: int = 8192
    max_tokens_per_turn: int = 512
    turn_timeout_s: float = 60.0
    trajectory_timeout_s: float = 1800.0
    temperature: float = 1.0
    top_p: float = 1.0


def turn_seed(episode_seed: int | None, turn: int, max_turns: int) -> int | None:
    """The sampling seed of one turn: distinct for every (episode, turn). Episode i of a group is seeded
    `seed * 1000 + i`, so `episode_seed + turn` gave episode i's turn t+1 the seed of episode i+1's turn t (22
    distinct seeds for 64 turns of two groups of 8): seeded sampling draws the same noise for the same seed, so
    where the next call's distribution barely depends on the context (a game whose prompt is the same for every
    task) the episodes of a group were correlated samples, not independent ones."""
    return None if episode_seed is None else episode_seed * max_turns + turn


@dataclass
class TokenRecord:
    """The growing token record of one trajectory."""

    token_ids: list[int]
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    prompt_length: int = 0

    def __post_init__(self) -> None:
        n = self.prompt_length = len(self.token_ids)
        self.loss_mask, self.logprobs, self.versions = [0] * n, [0.0] * n, [NOT_GENERATED] * n

    def add_generated(self, ids: list[int], logprobs: list[float], versions: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions

    def add_observation(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [NOT_GENERATED] * len(ids)

    def trajectory(self, **fields: Any) -> Trajectory:
        """The finished trajectory: this record's tokens, and `fields` for the rest (ids, rewards, finish)."""
        return Trajectory(
            token_ids=self.token_ids,
            loss_mask=self.loss_mask,
            logprobs=self.logprobs,
            policy_versions=self.versions,
            prompt_length=self.prompt_length,
            turns=self.turns,
            **fields,
        )


@dataclass
class EpisodeState:
    """How one episode stands, filled in as it runs (what survives a timeout or a sandbox failure)."""

    record: TokenRecord | None = None
    """The token record; None until the sandbox opened the session and the prompt exists."""
    finish: FinishReason = FinishReason.MAX_TURNS
    error: str | None = None
    """Why the episode failed (finish reason `error`)."""
    final: float | None = None
    """The outcome reward the submit step returned; None until then (the episode is scored at the end)."""
    timings: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "environment": 0.0})
    """Seconds per phase, summed over the turns."""


@dataclass
class Agent:
    """Runs episodes with one engine and one chat format."""

    engine: RolloutEngine
    chat: ChatFormat
    system_prompt: str
    limits: EpisodeLimits
    observe: Callable[[str, float], None] | None = None
    """Called with ("generate" | "environment", seconds) after each phase of each turn (metrics)."""

    def _timed(self, episode: EpisodeState, phase: str, seconds: float) -> None:
        episode.timings[phase] += seconds
        if self.observe is not None:
            self.observe(phase, seconds)

    async def run(self, env: ScoredEnvironment, task: Task, group_id: str, seed: int | None = None) -> Trajectory:
        """One episode of `task`; never raises for what the model or the environment does."""
        started = time.monotonic()
        episode = EpisodeState()
        try:
            await claim_environment(env, task)  # waiting for an image's pool is not the episode's time
            async with asyncio.timeout(self.limits.trajectory_timeout_s):
                episode.finish = await self._loop(env, task, seed, episode)
        except TimeoutError:
            episode.finish = FinishReason.TIMEOUT
        except (SandboxError, httpx.HTTPError) as err:
            episode.finish, episode.error = FinishReason.ERROR, f"sandbox failed: {err or type(err).__name__}"
            log.warning("episode of task %s in group %s: %s", task.task_id, group_id, episode.error)
        except EnvironmentFailure as err:
            episode.finish, episode.error = FinishReason.ERROR, f"environment failed: {err}"
            log.warning("episode of task %s in group %s: %s", task.task_id, group_id, episode.error)
        finally:
            session_id = env.session_id
            await close_environment(env)
        record = episode.record
        if record is None:  # the sandbox failed before the first prompt existed
            record = TokenRecord(self.chat.prompt_ids(self._messages(task.prompt)))
        if episode.final is None and episode.finish != FinishReason.ERROR:
            episode.final = env.final_reward()
        episode.timings["total"] = time.monotonic() - started
        return record.trajectory(
            trajectory_id=uuid.uuid4().hex,
            task_id=task.task_id,
            group_id=group_id,
            final_reward=episode.final or 0.0,
            finish_reason=episode.finish,
            resolved=env.resolved(),
            tampering=env.tampering(),
            error=episode.error,
            sandbox_session_id=session_id,
            timings=episode.timings,
        )

    async def _loop(self, env: ScoredEnvironment, task: Task, seed: int | None, episode: EpisodeState) -> FinishReason:
        """Open the session, then take turns; why the episode ended."""
        t0 = time.monotonic()
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a call that finishes as
        # the episode is cancelled, swallowing the cancellation (a cancelled group's episode went on)
        async with asyncio.timeout(self.limits.turn_timeout_s):
            observation = await env.reset(task)
        self._timed(episode, "environment", time.monotonic() - t0)
        record = episode.record = TokenRecord(self.chat.prompt_ids(self._messages(observation)))
        for turn in range(self.limits.max_turns):
            finish = await self._turn(env, record, turn_seed(seed, turn, self.limits.max_turns), episode)
            if finish is not None:
                return finish
        return FinishReason.MAX_TURNS

    async def _turn(
        self, env: ScoredEnvironment, record: TokenRecord, seed: int | None, episode: EpisodeState
    ) -> FinishReason | None:
        """Generate, run the tool call, append the observation; the finish reason when the episode ends here."""
        budget = min(self.limits.max_tokens_per_turn, self.limits.max_tokens - len(record.token_ids))
        if budget <= 0:
            return FinishReason.MAX_TOKENS
        t0 = time.monotonic()
        generation = await self.engine.generate(
            record.token_ids,
            max_tokens=budget,
            temperature=self.limits.temperature,
            top_p=self.limits.top_p,
            stop_token_ids=[self.chat.tokenizer.eos_token_id],
            seed=seed,
        )
        self._timed(episode, "generate", time.monotonic() - t0)
        start = len(record.token_ids)
        record.add_generated(generation.token_ids, generation.logprobs, generation.versions)
        action_end = len(record.token_ids)
        # Decoded only to read the tool call; the ids above are what the learner trains on.
        parsed = parse_tool_call(self.chat.tokenizer.decode(generation.token_ids, skip_special_tokens=True))
        reward, done, tool = None, False, None
        if isinstance(parsed, ParseError):
            text = parsed.message
        else:
            tool = parsed.name
            t0 = time.monotonic()
            try:
                async with asyncio.timeout(self.limits.turn_timeout_s):
                    result = await env.step(parsed)
            except TimeoutError:
                record.turns.append(Turn(start=start, action_end=action_end, end=action_end, tool=tool))
                return FinishReason.TIMEOUT
            finally:
                self._timed(episode, "environment", time.monotonic() - t0)
            text, reward, done = result.observation, result.reward, result.done
        if done:
            record.turns.append(Turn(start=start, action_end=action_end, end=action_end, reward=None, tool=tool))
            episode.final = reward
            return FinishReason.SUBMITTED
        observation_ids = self.chat.observation_ids(text)
        if len(record.token_ids) + len(observation_ids) > self.limits.max_tokens:
            record.turns.append(Turn(start=start, action_end=action_end, end=action_end, reward=reward, tool=tool))
            return FinishReason.MAX_TOKENS
        record.add_observation(observation_ids)
        record.turns.append(
            Turn(start=start, action_end=action_end, end=len(record.token_ids), reward=reward, tool=tool)
        )
        return None

    def _messages(self, observation: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": observation}]
