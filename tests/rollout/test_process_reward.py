"""The process reward (spec.reward.processReward): a weighted per-turn score added to every non-final step's
reward in a real sandbox episode, and a process reward model refused before the rollout server starts."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest
import yaml
from conftest import with_spec

from kuberl.api.environment import RewardContext, StepResult, ToolCall
from kuberl.api.rljob import RLJob
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_rollout.server import resolve_rewards

TASKS = generate(4, seed=9)
WEIGHT = 0.5
# Per-tool scores of the process reward below; read_file (and anything else) gets None, which counts as 0.
SCORES = {"replace": 1.0, "run_tests": 0.25}
MODEL_URI_ERROR = "spec.reward.processReward.modelUri"


class ToolScore:
    """A process reward that scores a turn by its tool, and remembers every context it was called with."""

    def __init__(self) -> None:
        self.calls: list[RewardContext] = []

    def __call__(self, ctx: RewardContext) -> float | None:
        self.calls.append(ctx)
        return SCORES.get(ctx.actions[-1].name)


def fixing_episode(sandbox, intermediate: bool, process: ToolScore | None) -> list[StepResult]:
    """read, run_tests, the fix, run_tests, submit: the step results of one episode."""
    task = TASKS[0]
    file, buggy, fix = task.metadata["file"], task.metadata["buggy"], task.metadata["fix"]
    calls = [
        ToolCall(name="read_file", arguments={"path": file}),
        ToolCall(name="run_tests"),
        ToolCall(name="replace", arguments={"path": file, "old": buggy, "new": fix}),
        ToolCall(name="run_tests"),
        ToolCall(name="submit"),
    ]

    async def episode() -> list[StepResult]:
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"), intermediate, process, WEIGHT)
        try:
            await env.reset(task)
            return [await env.step(call) for call in calls]
        finally:
            await env.close()
            await client.aclose()

    return asyncio.run(episode())


def test_the_weighted_process_score_is_each_non_final_steps_reward(sandbox):
    process = ToolScore()
    read, first_tests, edit, second_tests, submit = fixing_episode(sandbox, intermediate=False, process=process)
    # None from the process reward counts as 0: a scored turn, not an unscored one
    assert read.reward == 0.0
    assert first_tests.reward == second_tests.reward == WEIGHT * SCORES["run_tests"]
    assert edit.reward == WEIGHT * SCORES["replace"]
    assert submit.done and submit.reward == 1.0  # the outcome alone: no process score on the final step
    assert len(process.calls) == 4 and not any(ctx.final for ctx in process.calls)
    assert [len(ctx.actions) for ctx in process.calls] == [1, 2, 3, 4]


def test_the_process_score_adds_to_the_intermediate_reward(sandbox):
    read, first_tests, edit, second_tests, submit = fixing_episode(sandbox, intermediate=True, process=ToolScore())
    progress = second_tests.info["tests"]["fraction"] - first_tests.info["tests"]["fraction"]
    assert progress > 0  # the fix made visible tests pass: swe-toy-tests' intermediate reward is not None here
    assert read.reward == 0.0  # both None
    assert first_tests.reward == WEIGHT * SCORES["run_tests"]  # intermediate None (no earlier test run)
    assert edit.reward == WEIGHT * SCORES["replace"]
    assert second_tests.reward == pytest.approx(progress + WEIGHT * SCORES["run_tests"])
    assert submit.done and submit.reward == 1.0


def test_without_a_process_reward_steps_keep_their_intermediate_reward(sandbox):
    read, first_tests, edit, second_tests, submit = fixing_episode(sandbox, intermediate=True, process=None)
    assert read.reward is first_tests.reward is edit.reward is None
    assert second_tests.reward == pytest.approx(
        second_tests.info["tests"]["fraction"] - first_tests.info["tests"]["fraction"]
    )
    assert submit.reward == 1.0


def test_the_rollout_server_resolves_the_process_function_and_weight():
    job = RLJob.from_manifest(
        with_spec(reward={"processReward": {"enabled": True, "function": "swe-toy-tests", "weight": 0.3}})
    )
    rewards = resolve_rewards(job)
    assert rewards.process_reward is resolve_reward("swe-toy-tests")
    assert rewards.process_weight == 0.3
    assert rewards.function is resolve_reward("swe-toy-tests") and not rewards.intermediate_rewards


def test_a_disabled_process_reward_scores_nothing():
    job = RLJob.from_manifest(with_spec(reward={"processReward": {"enabled": False, "function": "swe-toy-tests"}}))
    rewards = resolve_rewards(job)
    assert rewards.process_reward is None and rewards.process_weight == 0.0


def test_a_process_reward_model_is_refused_with_the_field_to_use_instead():
    job = RLJob.from_manifest(with_spec(reward={"processReward": {"enabled": True, "modelUri": "s3://models/prm"}}))
    with pytest.raises(ValueError, match=MODEL_URI_ERROR) as err:
        resolve_rewards(job)
    assert "not supported" in str(err.value) and "spec.reward.processReward.function" in str(err.value)


def test_kuberl_rollout_server_refuses_a_process_reward_model_in_one_line(tmp_path):
    job = with_spec(reward={"processReward": {"enabled": True, "modelUri": "s3://models/prm"}})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    argv = [
        sys.executable,
        "-m",
        "kuberl_app.cli",
        "rollout-server",
        str(tmp_path / "job.yaml"),
        "--sandbox-url",
        "http://127.0.0.1:9",
    ]
    env = {**os.environ, "KUBERL_SANDBOX_TOKEN": "t", "KUBERL_JOB_TOKEN": "j"}
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    # a usage error (exit 2) before any model copy or engine start: no traceback
    assert result.returncode == 2, result.stderr
    assert MODEL_URI_ERROR in result.stderr and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"Error: {MODEL_URI_ERROR}: ")
