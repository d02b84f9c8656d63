"""Assemble a rollout server from an RLJob: engine, chat format, tasks, sandboxes, reward, app."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI

from kuberl.agent_resolver import resolve_agent
from kuberl.api import env_vars
from kuberl.api.environment import RewardFunction, ScoredEnvironment, Task
from kuberl.api.rljob import RLJob
from kuberl.api.spec import SWE_BENCH, LoraSpec, TrainingMode, openenv_class
from kuberl.api.types import parse_duration
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import REPOSITORY_SYSTEM_PROMPT, SWE_SYSTEM_PROMPT
from kuberl.rewards import check_tasks, job_rewards
from kuberl.storage import check_model_folder, local_copy
from kuberl.suites import environment_tasks
from kuberl.tokens import read_job_token
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.api import create_app
from kuberl_rollout.engine import EngineConfig, RolloutEngine
from kuberl_rollout.external_agent import ExternalAgent
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_rollout.sandbox_pools import SandboxPools
from kuberl_rollout.service import RolloutService
from kuberl_rollout.state import RolloutState
from kuberl_rollout.weights import BucketAssembler, expected_tensors


@dataclass(frozen=True)
class RolloutSettings:
    job: RLJob
    sandbox_urls: list[str]
    sandbox_token: str
    job_token: str
    """What every caller but the probes presents (`kuberl_rollout.auth`)."""
    model_path: str | None = None
    """Overrides spec.model.uri (a local copy already made)."""
    server_url: str = "http://127.0.0.1:8800"
    """This server's own URL as its external agents reach it (they run in this process)."""
    sandbox_pool_url: str | None = None
    """An image's pool's address with `{pool}` in it (env_vars.SANDBOX_POOL_URL); None: no per-image pools."""


def episode_limits(job: RLJob) -> EpisodeLimits:
    env, rollout = job.spec.environment, job.spec.rollout
    return EpisodeLimits(
        max_turns=env.max_turns,
        max_tokens=env.max_tokens_per_trajectory,
        max_tokens_per_turn=min(rollout.max_tokens_per_turn, env.max_tokens_per_trajectory),
        turn_timeout_s=parse_duration(env.turn_timeout),
        trajectory_timeout_s=parse_duration(env.trajectory_timeout),
        temperature=rollout.temperature,
        top_p=rollout.top_p,
    )


@dataclass(frozen=True)
class Rewards:
    """spec.reward resolved to the callables that score an episode."""

    function: RewardFunction
    intermediate_rewards: bool
    process_reward: RewardFunction | None = None
    process_weight: float = 0.0


def resolve_rewards(job: RLJob) -> Rewards:
    """The job's reward functions; ValueError (shown as a usage error) for an unknown or unsupported one."""
    reward = job.spec.reward
    outcome_fn, process_fn = job_rewards(reward)
    weight = reward.process_reward.weight if process_fn else 0.0
    return Rewards(outcome_fn, reward.intermediate_rewards, process_fn, weight)


def load_job_tasks(job: RLJob, reward_fn: RewardFunction) -> list[Task]:
    """Every task of the job (all splits); ValueError (a usage error) when `reward_fn` cannot score them."""
    env = job.spec.environment
    tasks = environment_tasks(env)
    check_tasks(reward_fn, tasks, env.tasks.uri or f"built-in task suite {env.name!r}")
    return tasks


@dataclass(frozen=True)
class EpisodeWorld:
    """What the job's episodes are played in: a new environment per episode, and the built-in agent's prompt."""

    open: Callable[[], ScoredEnvironment]
    system_prompt: str
    image_of: Callable[[Task], str] | None = None
    """The sandbox image a task's episodes run in ("" the job's servers); None: no sandboxes."""


def episode_world(settings: RolloutSettings, rewards: Rewards, metrics: RolloutMetrics) -> EpisodeWorld:
    """Sandbox sessions round-robin over the job's sandbox servers, or an OpenEnv environment class in process
    (`spec.environment.name: openenv:module:Class`); ValueError for a class that cannot be used."""
    scoring = (rewards.function, rewards.intermediate_rewards, rewards.process_reward, rewards.process_weight)
    ref = openenv_class(settings.job.spec.environment.name)
    if ref is not None:
        from kuberl.integrations.openenv_adapter import OpenEnvEnvironments, resolve_openenv_class

        openenv = OpenEnvEnvironments(resolve_openenv_class(ref), *scoring)
        return EpisodeWorld(openenv.open, openenv.system_prompt)
    pools = sandbox_pools(settings, metrics)
    started = metrics.sandbox_session_start_seconds.observe
    turn_s = parse_duration(settings.job.spec.environment.turn_timeout)

    def open_session() -> ScoredEnvironment:
        client = pools.default_client()
        return SandboxEnvironment(client, *scoring, session_started=started, command_timeout_s=turn_s, pools=pools)

    prompt = REPOSITORY_SYSTEM_PROMPT if settings.job.spec.environment.name == SWE_BENCH else SWE_SYSTEM_PROMPT
    return EpisodeWorld(open_session, prompt, pools.image)


def sandbox_pools(settings: RolloutSettings, metrics: RolloutMetrics) -> SandboxPools:
    """The job's sandbox servers, and its images' pools where the operator keeps them."""
    sandbox = settings.job.spec.sandbox
    return SandboxPools(
        [SandboxClient(url, settings.sandbox_token) for url in settings.sandbox_urls],
        settings.sandbox_token,
        settings.job.name,
        sandbox,
        settings.sandbox_pool_url,
        observe_wait=lambda image, seconds: metrics.sandbox_wait_seconds.labels(image).observe(seconds),
    )


def engine_config(job: RLJob, model_path: str) -> EngineConfig:
    """The engine of a job: its model, engine options and, with spec.model.lora, room for the adapters of every
    version a request may still sample with (maxStaleness behind the newest in async mode, none in sync)."""
    spec = job.spec
    dtype = "float32" if spec.model.dtype == "auto" else str(spec.model.dtype)
    max_len = spec.rollout.engine.max_model_len or spec.model.max_context_tokens
    staleness = spec.training.max_staleness if spec.training.mode == TrainingMode.ASYNC else 0
    return EngineConfig(model_path, spec.rollout.engine, dtype, max_len, spec.training.seed, spec.model.lora, staleness)


def policy_tensors(lora: LoraSpec | None, model_path: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of what a weight update carries: the adapter tensors with LoRA, else every model weight."""
    if lora is None:
        return expected_tensors(model_path)
    from kuberl.modeling.lora import adapter_tensor_shapes

    return adapter_tensor_shapes(model_path, lora)


def build_app(settings: RolloutSettings) -> FastAPI:
    spec = settings.job.spec
    # before the model copy and engine: a bad reward or task file fails at once
    rewards = resolve_rewards(settings.job)
    tasks = load_job_tasks(settings.job, rewards.function)
    agent_ref = spec.environment.agent
    entry_point = resolve_agent(agent_ref) if agent_ref is not None else None
    metrics = RolloutMetrics()
    world = episode_world(settings, rewards, metrics)
    model_path = settings.model_path or str(local_copy(spec.model.uri))
    check_model_folder(model_path)  # a clear error now, not vLLM's traceback later
    max_len = spec.rollout.engine.max_model_len or spec.model.max_context_tokens
    engine = RolloutEngine(engine_config(settings.job, model_path))

    async def build_state() -> RolloutState:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_path)
        await engine.start()
        metrics.kv_cache_usage.set_function(lambda: engine.kv_cache_usage)
        metrics.engine_waiting.set_function(lambda: engine.waiting_requests)
        agent = Agent(engine, ChatFormat(tokenizer), world.system_prompt, episode_limits(settings.job))
        service = RolloutService(
            agent,
            world.open,
            rewards.function,
            {t.task_id: t for t in tasks},
            spec.rollout.concurrent_sessions,
            metrics,
        )
        if world.image_of is not None:
            service.image_of = world.image_of
        if entry_point is not None and agent_ref is not None:
            service.runner = ExternalAgent(
                entry_point, agent_ref, service.sessions, settings.server_url, agent.chat, agent.limits, agent.observe
            )
        partial = spec.rollout.partial_rollouts
        mode = "keep" if partial else "wait"
        assembler = BucketAssembler(policy_tensors(spec.model.lora, model_path))
        drain = spec.rollout.update_drain_timeout
        return RolloutState(
            service,
            metrics,
            spec.model.uri,
            mode,
            assembler,
            max_len,
            partial_rollouts=partial,
            drain_timeout_s=None if drain is None else parse_duration(drain),
        )

    return create_app(build_state, settings.job_token, shutdown=engine.shutdown)


def settings_from_env(
    job: RLJob, sandbox_urls: list[str], model_path: str | None, server_url: str = "http://127.0.0.1:8800"
) -> RolloutSettings:
    urls = sandbox_urls or [u for u in os.environ.get(env_vars.SANDBOX_URLS, "").split(",") if u]
    token = os.environ.get(env_vars.SANDBOX_TOKEN, "")
    if not urls:
        raise ValueError("no sandbox servers: pass --sandbox-url or set KUBERL_SANDBOX_URLS")
    if not token:
        raise ValueError("no sandbox token: set KUBERL_SANDBOX_TOKEN")
    return RolloutSettings(
        job=job,
        sandbox_urls=urls,
        sandbox_token=token,
        job_token=read_job_token(),  # MissingToken is a ValueError: a usage error naming what to set
        model_path=model_path,
        server_url=server_url,
        sandbox_pool_url=os.environ.get(env_vars.SANDBOX_POOL_URL) or None,
    )
