"""Reward functions are found by registered name or module:function, with clear errors otherwise."""

from __future__ import annotations

import pytest

from kuberl.api.environment import RewardContext, StepResult, Task, ToolCall
from kuberl.rewards import check_tasks, resolve_reward, reward, swe_toy_tests_reward, task_problem

TASK = Task(task_id="t", prompt="p")


def ctx(*infos: dict, final: bool = False) -> RewardContext:
    results = [StepResult(observation="", info=i) for i in infos]
    return RewardContext(task=TASK, actions=[ToolCall(name="x")] * len(results), results=results, final=final)


def test_builtin_and_module_references():
    assert resolve_reward("swe-toy-tests") is swe_toy_tests_reward
    assert resolve_reward("kuberl.rewards:swe_toy_tests_reward") is swe_toy_tests_reward


def test_user_registration():
    @reward("always-one")
    def always_one(context: RewardContext) -> float:
        return 1.0

    assert resolve_reward("always-one")(ctx(final=True)) == 1.0
    with pytest.raises(ValueError, match="already registered"):
        reward("always-one")(lambda c: 0.0)


@pytest.mark.parametrize(
    ("ref", "words"),
    [
        ("nope", "unknown reward 'nope': registered rewards are"),
        ("no_such_module:f", "cannot import module"),
        ("kuberl.rewards:missing", "module 'kuberl.rewards' has no attribute 'missing'"),
        ("kuberl.rewards:ENVIRONMENT_REWARD", "'ENVIRONMENT_REWARD' is not callable"),
    ],
)
def test_bad_references(ref, words):
    with pytest.raises(ValueError, match=words):
        resolve_reward(ref)


def visible(fraction: float) -> dict:
    return {"tests": {"fraction": fraction}}


def hidden(resolved: bool) -> dict:
    return {"hiddenTests": {"fraction": 0.8, "failToPass": {"total": 3, "passed": 3}, "resolved": resolved}}


def test_swe_toy_reward_is_one_only_for_a_resolved_submission():
    assert swe_toy_tests_reward(ctx(hidden(True), final=True)) == 1.0
    assert swe_toy_tests_reward(ctx(hidden(False), final=True)) == 0.0  # most hidden tests pass: still 0
    assert swe_toy_tests_reward(ctx({"replaced": 1}, final=True)) == 0.0  # never submitted
    assert swe_toy_tests_reward(ctx(final=True)) == 0.0


def test_swe_toy_reward_refuses_a_submission_without_a_verdict():
    # A task without failToPass: the sandbox reports only the pass fraction, which is not what this reward pays.
    with pytest.raises(ValueError, match=r"task 't': .*needs the task's failToPass"):
        swe_toy_tests_reward(ctx({"hiddenTests": {"fraction": 0.6}}, final=True))


def test_swe_toy_reward_shapes_with_the_visible_test_fraction():
    assert swe_toy_tests_reward(ctx(visible(0.5))) is None  # the first test run sets the baseline
    assert swe_toy_tests_reward(ctx(visible(0.5), {"replaced": 1}, visible(1.0))) == 0.5
    assert swe_toy_tests_reward(ctx(visible(0.5), {"replaced": 1})) is None  # not a test run


RESOLVABLE = Task(task_id="r", prompt="p", hidden_tests={"hidden_test_m.py": ""}, fail_to_pass=["hidden_test_m.T.t"])


def test_tasks_without_fail_to_pass_are_refused_for_swe_toy_tests_only():
    assert task_problem(swe_toy_tests_reward, RESOLVABLE) is None
    assert "task 't' has no failToPass" in task_problem(swe_toy_tests_reward, TASK)
    check_tasks(swe_toy_tests_reward, [RESOLVABLE], "tasks.jsonl")
    with pytest.raises(
        ValueError,
        match=r"^tasks\.jsonl: 1 of 2 tasks cannot be scored; first: task 't' has no "
        r"failToPass: .*add them to the task file",
    ):
        check_tasks(swe_toy_tests_reward, [RESOLVABLE, TASK], "tasks.jsonl")
    check_tasks(lambda c: 1.0, [TASK], "tasks.jsonl")  # another reward scores what it likes
