"""Reward functions: plain callables registered by name, or given as `module:function` in the RLJob.

    from kuberl.rewards import reward

    @reward("my-reward")
    def my_reward(ctx):            # ctx: kuberl.api.environment.RewardContext
        if not ctx.final:
            return None            # no intermediate reward
        return 1.0 if "DONE" in ctx.last_result.observation else 0.0

See docs/rewards.md. Rewards are computed where the episode runs (the rollout tier), from what the
environment returned; user code never has to be installed in sandbox images.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kuberl.api.environment import RewardContext, RewardFunction, StepResult, Task, ToolCall
from kuberl.api.spec import RewardSpec
from kuberl.imports import import_reference

_REGISTRY: dict[str, RewardFunction] = {}


def reward(name: str) -> Callable[[RewardFunction], RewardFunction]:
    """Register a reward function under `name` (decorator)."""

    def register(fn: RewardFunction) -> RewardFunction:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered by {_REGISTRY[name]!r}")
        _REGISTRY[name] = fn
        return fn

    return register


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)


def resolve_reward(ref: str) -> RewardFunction:
    """The reward function named by `ref`: a registered name or `module:function`."""
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" not in ref:
        raise ValueError(
            f"unknown reward {ref!r}: registered rewards are {', '.join(registered_rewards())}; or give module:function"
        )
    fn = import_reference(ref, "reward", "module:function")
    if not callable(fn):
        raise ValueError(f"reward {ref!r}: {ref.partition(':')[2]!r} is not callable")
    return fn


class RewardFieldError(ValueError):
    """A job's reward field that cannot be used; `field` is its path in the manifest."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message


def job_rewards(reward_spec: RewardSpec) -> tuple[RewardFunction, RewardFunction | None]:
    """The job's outcome reward function and its process reward function (None when off). RewardFieldError for
    an unknown name, a `module:function` that does not import, or what is not supported: `kuberl validate` and
    the rollout server ask the same question."""
    process = reward_spec.process_reward
    if process.enabled and process.model_uri is not None:
        raise RewardFieldError(
            "spec.reward.processReward.modelUri",
            "process reward models are not supported yet; use spec.reward.processReward.function "
            "(a registered name or module:function) instead",
        )
    try:
        outcome = resolve_reward(reward_spec.function)
    except ValueError as err:
        raise RewardFieldError("spec.reward.function", str(err)) from None
    if not (process.enabled and process.function):  # validation: an enabled one without modelUri has a function
        return outcome, None
    try:
        return outcome, resolve_reward(process.function)
    except ValueError as err:
        raise RewardFieldError("spec.reward.processReward.function", str(err)) from None


class EpisodeScorer:
    """Scores one episode's steps with the job's reward functions, the same way for every environment: the final
    reward on the step that ends the episode, else the intermediate reward (if enabled) plus `process_weight`
    times the process score (if any), else no reward."""

    def __init__(
        self,
        reward_fn: RewardFunction,
        intermediate_rewards: bool = False,
        process_reward: RewardFunction | None = None,
        process_weight: float = 0.0,
    ) -> None:
        self.reward_fn, self.intermediate_rewards = reward_fn, intermediate_rewards
        self.process_reward, self.process_weight = process_reward, process_weight
        self.task: Task | None = None
        self.actions: list[ToolCall] = []
        self.results: list[StepResult] = []

    def start(self, task: Task) -> None:
        """A new episode on `task`: the steps so far are forgotten."""
        self.task, self.actions, self.results = task, [], []

    def score(self, action: ToolCall, result: StepResult) -> StepResult:
        """Record what `action` returned; `result` with its reward as the agent is to see it."""
        self.actions.append(action)
        self.results.append(result)
        if result.done:
            return result.model_copy(update={"reward": self.final_reward()})
        if self.intermediate_rewards or self.process_reward is not None:
            return result.model_copy(update={"reward": self._step_reward()})
        return result

    def _step_reward(self) -> float | None:
        context = self._context(final=False)
        intermediate = self.reward_fn(context) if self.intermediate_rewards else None
        if self.process_reward is None:
            return intermediate
        score = self.process_reward(context)
        return (intermediate or 0.0) + self.process_weight * (score or 0.0)

    def final_reward(self) -> float:
        """The outcome reward of the episode so far (0 for an episode cut off before it ended, or never started)."""
        if self.task is None:
            return 0.0
        value = self.reward_fn(self._context(final=True))
        return float(value) if value is not None else 0.0

    def _context(self, final: bool) -> RewardContext:
        if self.task is None:
            raise RuntimeError("no episode to score: call start(task) first")
        return RewardContext(task=self.task, actions=self.actions, results=self.results, final=final)


def _test_fraction(info: dict, key: str) -> float | None:
    tests = info.get(key)
    return float(tests["fraction"]) if isinstance(tests, dict) and "fraction" in tests else None


@reward("swe-toy-tests")
def swe_toy_tests_reward(ctx: RewardContext) -> float | None:
    """Outcome: 1.0 when the submission resolved the task, SWE-bench style (every FAIL_TO_PASS hidden test
    passes and every PASS_TO_PASS one still does), else 0.0; 0.0 when the agent never submitted.

    Intermediate (after each visible test run but the first): the change in the fraction of visible
    tests passing since the previous run. The shaping telescopes, so it rewards the edit that fixed
    a test without changing which policy is best.
    """
    last = ctx.last_result
    if ctx.final:
        return _resolved(ctx)
    if last is None or (now := _test_fraction(last.info, "tests")) is None:
        return None
    earlier = [f for r in ctx.results[:-1] if (f := _test_fraction(r.info, "tests")) is not None]
    return now - earlier[-1] if earlier else None


def _resolved(ctx: RewardContext) -> float:
    """1.0 when the submission's hidden-test verdict is resolved, 0.0 otherwise or without a submission."""
    last = ctx.last_result
    hidden = last.info.get("hiddenTests") if last else None
    if not isinstance(hidden, dict):
        return 0.0  # never submitted
    if "resolved" not in hidden:
        raise ValueError(f"task {ctx.task.task_id!r}: {_NOT_RESOLVABLE}")
    return 1.0 if hidden["resolved"] is True else 0.0


@reward("swe-bench-resolved")
def swe_bench_resolved_reward(ctx: RewardContext) -> float | None:
    """Outcome only, SWE-bench's verdict on a real repository: 1.0 when, with the instance's test patch applied,
    every FAIL_TO_PASS test passes and every PASS_TO_PASS test still does; 0.0 otherwise or without a submission.
    No intermediate reward: a repository's visible tests mostly pass before the fix."""
    return _resolved(ctx) if ctx.final else None


ENVIRONMENT_REWARD = "environmentReward"
"""The `StepResult.info` key under which an environment that scores its own steps (an OpenEnv environment's
`Observation.reward`) reports the reward it gave; reward functions read it there."""


@reward("openenv-return")
def openenv_return_reward(ctx: RewardContext) -> float | None:
    """Outcome: the episode's return, the sum of the rewards the environment gave over its steps (0.0 when it gave
    none). No intermediate reward: the return already counts every step's."""
    if not ctx.final:
        return None
    return float(sum(r.info.get(ENVIRONMENT_REWARD) or 0.0 for r in ctx.results))


_NOT_RESOLVABLE = (
    "reward swe-toy-tests scores SWE-bench 'resolved' and needs the task's failToPass (and passToPass) "
    "hidden test ids; add them to the task file (swe-toy tasks generated by the current generator have them) "
    "or choose another spec.reward.function"
)


def task_problem(fn: RewardFunction, task: Task) -> str | None:
    """Why reward `fn` cannot score `task` (a field the task lacks), or None."""
    if fn is swe_toy_tests_reward and task.fail_to_pass is None:
        if task.repository is not None:
            return f"task {task.task_id!r} is on a repository: score it with reward swe-bench-resolved"
        return f"task {task.task_id!r} has no failToPass: {_NOT_RESOLVABLE}"
    if fn is swe_bench_resolved_reward and task.repository is None:
        return f"task {task.task_id!r} is not a SWE-bench-format instance: swe-bench-resolved scores only those"
    return None


def check_tasks(fn: RewardFunction, tasks: Sequence[Task], source: str) -> None:
    """Raise ValueError, in one line naming `source`, when reward `fn` cannot score every task of it."""
    problems = [problem for task in tasks if (problem := task_problem(fn, task))]
    if problems:
        raise ValueError(f"{source}: {len(problems)} of {len(tasks)} tasks cannot be scored; first: {problems[0]}")
