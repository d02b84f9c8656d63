"""mini-swe-agent (PyPI `mini-swe-agent`, installed with the `agents` extra) as an external agent, unchanged:
`spec.environment.agent: kuberl.integrations.mini_swe_agent:solve` (examples/swe-toy-mini-swe-agent.yaml).

Its `DefaultAgent` and its litellm text-based model run as they are, in a thread of their own: they block, and
the rollout server's event loop must not. The model's calls go to the episode's recorded session (an OpenAI
base URL), so the engine samples them and they are recorded token-in/token-out; its bash commands go to the
episode's sandbox session through `SandboxBashEnvironment` (mini-swe-agent's `Environment` protocol), and its
submit command (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) submits the workspace there, for the job's
reward function to score. Another configuration: `solve = entry_point("my_config.yaml")` in a module of yours.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import shlex
import threading
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel

# Set before the imports read them: mini-swe-agent prints a banner on import, and litellm would fetch its model
# cost map from the internet (a rollout pod has no egress; the model here costs nothing).
os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import litellm
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from minisweagent.exceptions import Submitted
from minisweagent.models.litellm_textbased_model import LitellmTextbasedModel
from minisweagent.utils.serialize import recursive_merge

from kuberl.api.agents import AgentEntryPoint, AgentEnvironment
from kuberl.api.environment import StepResult, Task

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""The first output line of mini-swe-agent's submit command."""
DEFAULT_CONFIG = "mini_textbased"
"""mini-swe-agent's own configuration with the command in a fenced block: any chat model can follow it."""
MODEL_NAME = "openai/policy"
"""litellm's name for a model of an OpenAI-compatible server (the rollout server answers to any model name)."""
BUDGET_SPENT = "token budget is spent"
"""In the rollout server's 400 answer once `environment.maxTokensPerTrajectory` is used up."""

T = TypeVar("T")


class EpisodeOver(Exception):
    """The episode ended (timed out or cancelled) while mini-swe-agent's thread still ran."""


class SandboxBashConfig(BaseModel):
    """The `environment` section of a mini-swe-agent configuration, as far as a sandbox session uses it."""

    env: dict[str, str] = {}
    """Variables set for each command (mini-swe-agent's configurations set PAGER=cat and the like)."""
    cwd: str = ""
    """Where commands run, relative to the workspace (the workspace itself by default)."""


class SandboxBashEnvironment:
    """mini-swe-agent's `Environment` protocol on the episode's sandbox session: each command runs there through
    `env.run` (the job's turn timeout and turn limit apply); the submit command submits the workspace.

    `call` runs one of `episode`'s coroutines to its result from this (mini-swe-agent's) thread."""

    def __init__(
        self, episode: AgentEnvironment, call: Callable[[Coroutine[Any, Any, StepResult]], StepResult], **config: Any
    ) -> None:
        self.config = SandboxBashConfig(**config)
        self._env, self._call = episode, call

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run `action["command"]`; `timeout` is the sandbox's (environment.turnTimeout), not the caller's."""
        prefix = "".join(f"export {name}={shlex.quote(value)}; " for name, value in self.config.env.items())
        if where := cwd or self.config.cwd:
            prefix += f"cd {shlex.quote(where)} && "
        result = self._call(self._env.run(prefix + action.get("command", "")))
        output = command_output(result)
        lines = output["output"].lstrip().splitlines()
        if lines and lines[0].strip() == SUBMIT and output["returncode"] == 0:
            submitted = self._call(self._env.submit())
            extra = {"exit_status": "Submitted", "submission": submitted.observation}
            raise Submitted({"role": "exit", "content": submitted.observation, "extra": extra})
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # the configurations' templates name the host (`{{system}}` decides how to call sed): the sandbox runs
        # on a host of the same kind as the rollout server's (Linux pods; the same machine under `kuberl run`)
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)

    def serialize(self) -> dict[str, Any]:
        kind = f"{type(self).__module__}.{type(self).__name__}"
        return {"info": {"config": {"environment": self.config.model_dump(mode="json"), "environment_type": kind}}}


def command_output(result: StepResult) -> dict[str, Any]:
    """A `run` tool's result in the shape of mini-swe-agent's LocalEnvironment: output, returncode, exception."""
    if "exitCode" not in result.info and "timedOut" not in result.info:  # the tool failed: its observation says why
        return {"output": "", "returncode": -1, "exception_info": result.observation}
    output = result.observation.rpartition("\n[")[0]  # the sandbox's closing `[exit code N]` line
    code = result.info.get("exitCode")
    timed_out = bool(result.info.get("timedOut"))
    return {
        "output": output,
        "returncode": -1 if code is None else int(code),
        "exception_info": "the command timed out (environment.turnTimeout)" if timed_out else "",
    }


class SessionModel(LitellmTextbasedModel):
    """mini-swe-agent's text-based litellm model on the episode's recorded session. It gives up at once on a
    refused call (a spent token budget answers 400) and once the episode is over, where the stock model would
    retry for minutes."""

    abort_exceptions: ClassVar[list[type[BaseException]]] = [
        *LitellmTextbasedModel.abort_exceptions,
        litellm.exceptions.BadRequestError,
        EpisodeOver,
    ]

    def __init__(self, over: threading.Event, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._over = over

    def _query(self, messages: list[dict[str, str]], **kwargs: Any) -> Any:
        if self._over.is_set():
            raise EpisodeOver("the episode is over")
        return super()._query(messages, **kwargs)


def entry_point(
    config: str | Path | dict[str, Any] = DEFAULT_CONFIG, trajectories: str | Path | None = None
) -> AgentEntryPoint:
    """An external agent that plays each episode with mini-swe-agent's `DefaultAgent` and `config` (a file, the
    name of one of its built-in configurations, or the dict: sections `agent`, `model`, `environment`). With
    `trajectories`, each episode's mini-swe-agent trajectory is saved there (`<task>-<id>.traj.json`)."""
    spec = config if isinstance(config, dict) else get_config_from_spec(config)

    async def solve(task: Task, base_url: str, env: AgentEnvironment) -> None:
        loop = asyncio.get_running_loop()
        over = threading.Event()

        def call(coroutine: Coroutine[Any, Any, StepResult]) -> StepResult:
            if over.is_set():
                coroutine.close()
                raise EpisodeOver("the episode is over")
            return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

        session = {"model_name": MODEL_NAME, "cost_tracking": "ignore_errors"}
        session["model_kwargs"] = {"api_base": base_url, "api_key": env.api_key}
        model = SessionModel(over, **recursive_merge(spec.get("model", {}), session))
        sandbox = SandboxBashEnvironment(env, call, **spec.get("environment", {}))
        agent = DefaultAgent(model, sandbox, **{**spec.get("agent", {}), "output_path": None})

        def play() -> None:
            try:
                agent.run(env.observation)
            finally:
                if trajectories is not None:
                    path = Path(trajectories) / f"{task.task_id}-{uuid.uuid4().hex[:12]}.traj.json"
                    # the session's API key stays out of the saved configuration
                    hidden = {"config": {"model": {"model_kwargs": {"api_key": "(the session's key)"}}}}
                    agent.save(path, {"info": {"kuberl": {"base_url": base_url}, **hidden}})

        try:
            await in_own_thread(play)
        except litellm.exceptions.BadRequestError as err:
            if BUDGET_SPENT not in str(err):
                raise
            # the episode used its tokens: it ends as a cut-off one (scored, finish reason max_turns)
        finally:
            over.set()

    return solve


async def in_own_thread(fn: Callable[[], T]) -> T:
    """`fn()` in a new daemon thread: an episode may outlast the default executor's few workers, and a
    cancelled episode leaves its thread to notice (`EpisodeOver`) rather than holding a worker."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.cancelled():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        try:
            result, error = fn(), None
        except BaseException as err:  # handed to the episode, which decides what it means
            result, error = None, err
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=target, name="mini-swe-agent", daemon=True).start()
    return await done


solve = entry_point()
"""The entry point with mini-swe-agent's own text-based configuration."""
