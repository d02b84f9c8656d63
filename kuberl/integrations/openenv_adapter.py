"""OpenEnv environments (PyPI `openenv-core`, installed with the `agents` extra) through KubeRL's environment
protocol: `spec.environment.name: openenv:module:Class` names a subclass of openenv's `Environment`
(examples/openenv-guess.yaml).

The rollout server plays each episode on an instance of its own, in process (openenv's server interface:
`reset`/`step`/`state` over its `Action` and `Observation` models; sync methods run in a worker thread, so
a slow environment never blocks the event loop). The environment's action is the model's one tool: its name is
the action class's without `Action`, in snake_case (`GuessAction` -> `guess`), its arguments the action's fields,
written and parsed as every KubeRL tool call is (`kuberl.modeling.tool_calls`). A task is the reset's arguments
(`metadata.seed`, `metadata.resetArgs`); the observation's fields are the text the model reads; the reward each
observation carries goes to the job's reward function under `info.environmentReward` (reward `openenv-return`
sums them), and `done` ends the episode. What the environment raises ends that episode with finish reason
`error` and the reason, never the server.
"""

from __future__ import annotations

import asyncio
import json
import re
import typing
import uuid
from typing import Any

from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironmentBase
from openenv.core.env_server.types import Action, Observation
from pydantic import ValidationError

from kuberl.api.environment import EnvironmentFailure, RewardFunction, Snapshot, StepResult, Task, ToolCall
from kuberl.imports import import_reference
from kuberl.modeling.tool_calls import system_prompt
from kuberl.rewards import ENVIRONMENT_REWARD, EpisodeScorer

_SKIPPED_FIELDS = {"metadata"}  # openenv's own bookkeeping on every Action, not an argument the model writes
_OBSERVATION_BOOKKEEPING = {"done", "reward", "metadata"}


def resolve_openenv_class(ref: str) -> type[OpenEnvEnvironmentBase]:
    """The OpenEnv `Environment` subclass `ref` (`module:Class`) names; ValueError saying why when there is none."""
    cls = import_reference(ref, "OpenEnv environment", "module:Class")
    if not isinstance(cls, type) or not issubclass(cls, OpenEnvEnvironmentBase):
        raise ValueError(
            f"OpenEnv environment {ref!r}: {ref.partition(':')[2]!r} is not a subclass of "
            "openenv.core.env_server.Environment"
        )
    action_class(cls)  # raises for an environment whose action type cannot be found
    return cls


def action_class(env_class: type[OpenEnvEnvironmentBase]) -> type[Action]:
    """The environment's action model: `Environment[MyAction, MyObservation, MyState]`'s first argument, else
    the annotation of `step`'s `action`."""
    for klass in env_class.__mro__:
        for base in getattr(klass, "__orig_bases__", ()):
            if typing.get_origin(base) is OpenEnvEnvironmentBase:
                found = typing.get_args(base)[0]
                if isinstance(found, type) and issubclass(found, Action):
                    return found
    hint = typing.get_type_hints(env_class.step).get("action")
    if isinstance(hint, type) and issubclass(hint, Action) and hint is not Action:
        return hint
    raise ValueError(
        f"OpenEnv environment {env_class.__name__}: cannot tell its action type; declare the class as "
        "Environment[MyAction, MyObservation, MyState] or annotate step(self, action: MyAction)"
    )


def tool_name(action: type[Action]) -> str:
    """The tool the model calls for `action`: `GuessAction` -> `guess`."""
    stem = action.__name__.removesuffix("Action") or action.__name__
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", stem).lower()


def tool_arguments(action: type[Action]) -> list[str]:
    return [name for name in action.model_fields if name not in _SKIPPED_FIELDS]


def openenv_system_prompt(env_class: type[OpenEnvEnvironmentBase]) -> str:
    """The built-in agent's system prompt for an OpenEnv environment: its description and its one tool."""
    action = action_class(env_class)
    doc = (env_class.__doc__ or "").strip().split("\n\n")[0]
    intro = " ".join(doc.split()) or f"You play the {env_class.__name__} environment."
    signature = f"{tool_name(action)}({', '.join(tool_arguments(action))})"
    return system_prompt(intro, [signature], "The episode ends when the environment says it is done.")


def observation_text(observation: Observation) -> str:
    """What the model reads: the observation's own fields (a lone string field as it is, else JSON)."""
    fields = observation.model_dump(mode="json", exclude=_OBSERVATION_BOOKKEEPING)
    if len(fields) == 1 and isinstance(only := next(iter(fields.values())), str):
        return only
    return json.dumps(fields, ensure_ascii=False)


def _overrides(env: OpenEnvEnvironmentBase, name: str) -> bool:
    return getattr(type(env), name) is not getattr(OpenEnvEnvironmentBase, name)


class OpenEnvEnvironment:
    """One episode on a fresh instance of an OpenEnv environment class (a `ScoredEnvironment`)."""

    def __init__(
        self,
        env_class: type[OpenEnvEnvironmentBase],
        reward_fn: RewardFunction,
        intermediate_rewards: bool = False,
        process_reward: RewardFunction | None = None,
        process_weight: float = 0.0,
    ) -> None:
        self.env_class, self.action = env_class, action_class(env_class)
        self.tool = tool_name(self.action)
        self.scorer = EpisodeScorer(reward_fn, intermediate_rewards, process_reward, process_weight)
        self.session_id: str | None = None
        self._env: OpenEnvEnvironmentBase | None = None
        self._done = False

    async def reset(self, task: Task) -> str:
        """A new instance of the class, reset with the task's seed and reset arguments; its first observation."""
        seed, extra = task.metadata.get("seed"), task.metadata.get("resetArgs") or {}
        episode_id = uuid.uuid4().hex
        self.scorer.start(task)
        self._done = False
        self._env = env = await self._call("construct", self.env_class)
        self.session_id = episode_id
        first = await self._call("reset", env.reset, env.reset_async, seed=seed, episode_id=episode_id, **extra)
        return observation_text(self._observation(first, "reset"))

    async def step(self, action: ToolCall) -> StepResult:
        """Apply the model's tool call as the environment's action; a wrong tool or bad arguments come back as an
        error observation (the environment is not stepped), as a sandbox answers a bad tool call."""
        if self._env is None:
            raise RuntimeError("no episode: call reset(task) first")
        if self._done:
            raise RuntimeError("the episode is over: the environment said done")
        if action.name != self.tool:
            return self.scorer.score(action, StepResult(observation=self._usage(f"unknown tool {action.name!r}")))
        try:
            env_action = self.action.model_validate(action.arguments)
        except ValidationError as err:
            problem = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in err.errors())
            return self.scorer.score(action, StepResult(observation=self._usage(f"bad arguments ({problem})")))
        observation = self._observation(
            await self._call("step", self._env.step, self._env.step_async, env_action), "step"
        )
        self._done = observation.done
        reward = None if observation.reward is None else float(observation.reward)
        result = StepResult(
            observation=observation_text(observation),
            done=observation.done,
            info={ENVIRONMENT_REWARD: reward, "metadata": observation.metadata},
        )
        return self.scorer.score(action, result)

    def final_reward(self) -> float:
        return self.scorer.final_reward()

    def resolved(self) -> bool | None:
        return None  # an OpenEnv task has no hidden tests to resolve

    def tampering(self) -> str | None:
        return None

    async def snapshot(self) -> Snapshot:
        raise EnvironmentFailure("OpenEnv environments cannot be snapshotted (openenv's Environment has no restore)")

    async def restore(self, snapshot: Snapshot) -> None:
        raise EnvironmentFailure("OpenEnv environments cannot be restored (openenv's Environment has no restore)")

    async def close(self) -> None:
        env, self._env, self.session_id = self._env, None, None
        if env is not None:
            await self._call("close", env.close)

    def _usage(self, problem: str) -> str:
        return f"error: {problem}; the one tool is {self.tool}({', '.join(tool_arguments(self.action))})"

    def _observation(self, value: Any, method: str) -> Observation:
        if not isinstance(value, Observation):
            raise EnvironmentFailure(
                f"OpenEnv environment {self.env_class.__name__}: {method} returned {type(value).__name__}, "
                "not an Observation"
            )
        return value

    async def _call(self, method: str, sync: Any, asynchronous: Any = None, *args: Any, **kwargs: Any) -> Any:
        """`method` of the environment: its own async version if it overrides one, else the sync one in a worker
        thread; anything it raises becomes an EnvironmentFailure naming the class and the method."""
        try:
            if asynchronous is not None and self._env is not None and _overrides(self._env, f"{method}_async"):
                return await asynchronous(*args, **kwargs)
            return await asyncio.to_thread(sync, *args, **kwargs)
        except Exception as err:
            raise EnvironmentFailure(
                f"OpenEnv environment {self.env_class.__name__}.{method} raised {type(err).__name__}: {err}"
            ) from err


class OpenEnvEnvironments:
    """Opens an `OpenEnvEnvironment` per episode of one class, scored by the job's reward functions."""

    def __init__(
        self,
        env_class: type[OpenEnvEnvironmentBase],
        reward_fn: RewardFunction,
        intermediate_rewards: bool = False,
        process_reward: RewardFunction | None = None,
        process_weight: float = 0.0,
    ) -> None:
        self.env_class = env_class
        self._scoring = (reward_fn, intermediate_rewards, process_reward, process_weight)
        self.system_prompt = openenv_system_prompt(env_class)

    def open(self) -> OpenEnvEnvironment:
        return OpenEnvEnvironment(self.env_class, *self._scoring)

    async def aclose(self) -> None:
        return None
