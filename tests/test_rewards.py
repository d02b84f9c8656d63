"""Reward functions are found by registered name or module:function, with clear errors otherwise."""

from __future__ import annotations

import pytest

from kuberl.api.environment import RewardContext, StepResult, Task, ToolCall
from kuberl.rewards import resolve_reward, reward, swe_toy_tests_reward

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
        ("kuberl.rewards:missing", "has no callable 'missing'"),
    ],
)
def test_bad_references(ref, words):
    with pytest.raises(ValueError, match=words):
        resolve_reward(ref)


def visible(fraction: float) -> dict:
    return {"tests": {"fraction": fraction}}


def test_swe_toy_reward_outcome_and_shaping():
    assert swe_toy_tests_reward(ctx({"hiddenTests": {"fraction": 0.6}}, final=True)) == 0.6
    assert swe_toy_tests_reward(ctx({"replaced": 1}, final=True)) == 0.0  # never submitted
    assert swe_toy_tests_reward(ctx(visible(0.5))) is None  # the first test run sets the baseline
    assert swe_toy_tests_reward(ctx(visible(0.5), {"replaced": 1}, visible(1.0))) == 0.5
    assert swe_toy_tests_reward(ctx(visible(0.5), {"replaced": 1})) is None  # not a test run
