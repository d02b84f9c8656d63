"""The environment protocol and the reward interface every tier agrees on.

An environment turns a task into an observation, applies actions (tool calls) and can snapshot and
restore its state, so that an episode can be rebuilt exactly elsewhere. A reward function is a plain
callable registered by name; it is the only code most users write.
"""

from __future__ import annotations

from typing import Annotated, Any, Protocol, Self, runtime_checkable

from pydantic import AfterValidator, Field, JsonValue, model_validator

from kuberl.api.base import ApiModel
from kuberl.api.spec import TaskSplit
from kuberl.api.swebench import RepositoryTask
from kuberl.api.types import Image


def check_relative_path(path: str) -> str:
    """A workspace-relative POSIX path: not absolute, no '..' component, no backslashes, not empty."""
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"expected a relative path inside the workspace such as 'src/app.py', got {path!r}")
    return path


def _check_file_map(files: dict[str, str]) -> dict[str, str]:
    for path in files:
        check_relative_path(path)
    return files


FileMap = Annotated[dict[str, str], AfterValidator(_check_file_map)]

TestId = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){2,}$")]
"""A unittest test id relative to the hidden test files: `module.Class.method` (the module may be dotted)."""


def _hidden_module(path: str) -> str:
    """The module name unittest runs a hidden test file as: `sub/hidden_test_x.py` -> `sub.hidden_test_x`."""
    return path.removesuffix(".py").replace("/", ".")


PythonName = Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")]


class CallCheck(ApiModel):
    """One check of the trusted oracle: `function(*args)` of the workspace's `module` must return `expected`.

    The call runs in a process of the agent's (its code may do anything there); only the returned value comes
    back, as JSON, and the comparison is made by the sandbox server, so `expected` never enters that process.
    Values compare as JSON does: a tuple returned equals the same list expected."""

    test_id: TestId
    """The test this check belongs to (a test passes when all its checks pass): a failToPass or passToPass id
    for hidden checks, `test_module.Class.method` of the visible tests for visible ones."""
    module: PythonName
    """The module to import from the workspace, e.g. `geometry`."""
    function: PythonName
    """A function (or dotted attribute path) of the module."""
    args: list[JsonValue] = Field(default_factory=list)
    """Positional arguments."""
    expected: JsonValue
    """What the correct code returns."""
    message: str | None = None
    """Shown to the agent when a visible check fails (as a test's assertion message would be)."""


class Oracle(ApiModel):
    """Checks of a task that the sandbox scores without running test code in the agent's process: the
    trusted scoring path for RL (see docs/rewards.md). With an oracle, `run_tests` runs `visible` and
    `submit` runs `hidden`; the test files stay in the task for people and for other harnesses."""

    visible: list[CallCheck] = Field(default_factory=list)
    """What the `run_tests` tool checks (and the intermediate reward counts)."""
    hidden: list[CallCheck] = Field(min_length=1)
    """What `submit` scores; their test ids are the task's failToPass and passToPass."""


class Task(ApiModel):
    """One task of a suite: the files the agent starts from, how to test them, and the hidden tests.

    Suites are stored as JSONL, one Task per line in its camelCase wire form (see docs/tasks.md).
    """

    task_id: str = Field(min_length=1, max_length=256)
    """Unique within its suite."""
    split: TaskSplit = TaskSplit.TRAIN
    """train or test (held out)."""
    prompt: str
    """Instruction shown to the agent."""
    files: FileMap = Field(default_factory=dict)
    """Initial workspace: relative path -> content. Visible tests live here too."""
    test_command: str = "python -m unittest -q"
    """Command the `run_tests` tool runs in the workspace (through /bin/sh)."""
    hidden_tests: FileMap = Field(default_factory=dict)
    """Test files added only when scoring at submit; the agent never sees them."""
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Suite-specific data (bug kind, candidate edits, seed...); never shown to the agent."""
    fail_to_pass: list[TestId] | None = Field(default=None, min_length=1)
    """Hidden test ids that fail on the starting files and must pass after the fix (SWE-bench FAIL_TO_PASS)."""
    pass_to_pass: list[TestId] | None = None
    """Hidden test ids that pass on the starting files and must still pass (SWE-bench PASS_TO_PASS)."""
    oracle: Oracle | None = None
    """Calls with expected results that the sandbox checks itself: a score the code under test cannot forge."""
    repository: RepositoryTask | None = None
    """A task on a real repository (a SWE-bench-format instance): the workspace is the repository at its base
    commit and the score is its pytest FAIL_TO_PASS / PASS_TO_PASS verdict (docs/tasks.md). Such a task has no
    `files`, `hiddenTests`, `failToPass` or `oracle` of its own."""
    image: Image | None = None
    """The environment image the task's sandbox session runs in on a cluster (its instance's `image`); unset:
    spec.sandbox.imageTemplate filled from the task's fields, else spec.sandbox.image. `kuberl run` ignores it."""

    @model_validator(mode="after")
    def _repository_alone(self) -> Self:
        if self.repository is None:
            return self
        given = [
            name
            for name, value in (
                ("files", self.files),
                ("hiddenTests", self.hidden_tests),
                ("failToPass", self.fail_to_pass),
                ("passToPass", self.pass_to_pass),
                ("oracle", self.oracle),
            )
            if value
        ]
        if given:
            raise ValueError(f"repository: a task on a repository takes its tests from it; remove {given}")
        return self

    @model_validator(mode="after")
    def _ids_name_hidden_tests(self) -> Self:
        modules = self.hidden_test_modules
        ids = [*(self.fail_to_pass or []), *(self.pass_to_pass or [])]
        if outside := [i for i in ids if not any(i.startswith(m + ".") for m in modules)]:
            raise ValueError(
                f"failToPass/passToPass: test ids {outside} name no hiddenTests file; expected "
                f"module.Class.method with the module one of {modules}"
            )
        if self.oracle is not None and self.fail_to_pass is not None:
            checked = {c.test_id for c in self.oracle.hidden}
            if missing := sorted(set(ids) - checked):
                raise ValueError(f"oracle.hidden: no check for the failToPass/passToPass ids {missing}")
            if extra := sorted(checked - set(ids)):
                raise ValueError(
                    f"oracle.hidden: checks of test ids {extra} that are in neither failToPass nor passToPass"
                )
        return self

    @property
    def hidden_test_modules(self) -> list[str]:
        """The hidden test files as the module names unittest runs."""
        return [_hidden_module(path) for path in self.hidden_tests]


class ToolCall(ApiModel):
    """An action: a named tool with JSON arguments."""

    name: str = Field(min_length=1)
    """Tool name, e.g. run, read_file, write_file, submit."""
    arguments: dict[str, Any] = Field(default_factory=dict)
    """Tool arguments."""


class StepResult(ApiModel):
    """What applying an action returned."""

    observation: str
    """Text fed back to the agent."""
    reward: float | None = None
    """Intermediate reward after this step, if the reward function gives one."""
    done: bool = False
    """The episode is over (submitted, or the environment ended it)."""
    info: dict[str, Any] = Field(default_factory=dict)
    """Diagnostics: exit codes, test results, timings."""


class Snapshot(ApiModel):
    """A session's state, enough to rebuild it exactly on any sandbox server.

    `checksum` (SHA-256 over the workspace's paths, modes and contents) proves the rebuilt workspace
    matches; `mac` proves a sandbox server of the job made the snapshot (the archive carries files the
    agent made: a server restores only what a server sealed); `actions` is the log of what the agent did,
    in order.
    """

    session_id: str
    """Session the snapshot was taken from."""
    task_id: str
    """Task the session was created from (the restore needs the task again for its hidden tests)."""
    checksum: str = Field(pattern=r"^[0-9a-f]{64}$")
    """SHA-256 of the workspace."""
    data: str
    """The workspace as a base64 tar.gz archive."""
    mac: str = Field(pattern=r"^[0-9a-f]{64}$")
    """HMAC-SHA256 of the task id, checksum and archive under a key the job's sandbox servers share."""
    actions: list[dict[str, Any]] = Field(default_factory=list)
    """Mutating actions so far (commands, writes, replacements), in order."""


@runtime_checkable
class Environment(Protocol):
    """An agent's world. Implementations may be local or call a sandbox server over HTTP."""

    async def reset(self, task: Task) -> str:
        """Start an episode on `task` and return the initial observation."""
        ...

    async def step(self, action: ToolCall) -> StepResult:
        """Apply one action."""
        ...

    async def snapshot(self) -> Snapshot:
        """Capture the state so the episode can continue elsewhere."""
        ...

    async def restore(self, snapshot: Snapshot) -> None:
        """Rebuild the state of `snapshot`; raises if the checksum does not match."""
        ...

    async def close(self) -> None:
        """End the episode and release what it holds."""
        ...


class EnvironmentFailure(RuntimeError):
    """The environment itself failed (a sandbox server's error, an environment library's exception): the
    episode ends with finish reason `error` and this message, and the server goes on serving."""


@runtime_checkable
class ScoredEnvironment(Environment, Protocol):
    """An environment as the rollout tier plays it: scored by the job's reward function, and able to say how
    the episode ended. Agent loops depend on this, not on a concrete environment."""

    @property
    def session_id(self) -> str | None:
        """The id of the open session or episode (recorded on the trajectory); None before reset or after close."""
        ...

    def final_reward(self) -> float:
        """The outcome reward of the episode so far (0 for an episode cut off before it ended)."""
        ...

    def resolved(self) -> bool | None:
        """Whether the episode resolved its task, where the task says what that means; None otherwise."""
        ...

    def tampering(self) -> str | None:
        """Why a test report of the episode was judged forged (a TamperingReason value), or None."""
        ...


@runtime_checkable
class Environments(Protocol):
    """Opens an environment per episode and releases what they share (the rollout tier's sandbox client,
    say). The trainer's warm-up and credit probes are handed one by a composition root (`app/kuberl_app/cli.py`,
    `app/kuberl_app/one_machine/`), so they play episodes without importing the tier that serves them."""

    def open(self) -> Environment:
        """A new environment for one episode."""
        ...

    async def aclose(self) -> None:
        """Release what the environments share; none is used afterwards."""
        ...


class RewardContext(ApiModel):
    """What a reward function sees: the task, every action so far and what each returned."""

    task: Task
    """The task."""
    actions: list[ToolCall]
    """Actions taken so far, oldest first."""
    results: list[StepResult]
    """What each action returned, aligned with `actions`."""
    final: bool = False
    """True once the episode is over and the outcome reward is wanted."""

    @property
    def last_result(self) -> StepResult | None:
        return self.results[-1] if self.results else None


class RewardFunction(Protocol):
    """A reward function: a float, or None for "no reward at this step" (intermediate calls only)."""

    def __call__(self, context: RewardContext) -> float | None: ...
