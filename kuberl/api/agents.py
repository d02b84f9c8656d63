"""External agents: what `spec.environment.agent` (`module:function`) names, and the environment handle it is
given. The rollout tier runs the entry point once per episode, in place of the built-in agent loop.

    async def my_agent(task, base_url, env):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=env.api_key)
        messages = [{"role": "user", "content": env.observation}]
        ...                           # call the model, run tools with env.step / env.run / env.submit
        await env.submit()

Every model call through `base_url` (authenticated with the episode session's own `env.api_key`) is recorded
token-in/token-out; when the entry point returns, the
episode is scored by the job's reward function (unless the agent closed its session with a reward) and its
trajectory joins the learner's stream like the built-in loop's.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from kuberl.api.environment import StepResult, Task, ToolCall


@runtime_checkable
class AgentEnvironment(Protocol):
    """The episode's sandbox session, opened on the task before the entry point starts."""

    @property
    def observation(self) -> str:
        """The task's initial observation, as the environment renders it."""
        ...

    @property
    def done(self) -> bool:
        """The episode is over (the agent submitted)."""
        ...

    @property
    def api_key(self) -> str:
        """The API key of the episode's session: the OpenAI client's `api_key` for `base_url` (it opens no other
        session's routes)."""
        ...

    async def step(self, action: ToolCall) -> StepResult:
        """Apply one tool call (within the job's turn timeout)."""
        ...

    async def call(self, name: str, **arguments: Any) -> StepResult:
        """`step` with a tool named and its arguments given as keywords."""
        ...

    async def run(self, command: str) -> StepResult:
        """Run a shell command in the workspace."""
        ...

    async def run_tests(self) -> StepResult:
        """Run the task's visible tests."""
        ...

    async def submit(self) -> StepResult:
        """Submit the workspace: the hidden tests run and the episode is over."""
        ...


class AgentEntryPoint(Protocol):
    """An external agent: plays one episode of `task`, its model calls going to `base_url` (an OpenAI base
    URL), its tool calls to `env`. What it returns is ignored; what it raises fails the episode."""

    async def __call__(self, task: Task, base_url: str, env: AgentEnvironment) -> Any: ...
