"""A whole swe-toy episode through the environment protocol, scored by the registered reward."""

from __future__ import annotations

import asyncio
import re

import httpx

from kuberl.api.environment import ToolCall
from kuberl.rewards import resolve_reward
from kuberl_sandbox.client import SandboxClient, SandboxEnvironment
from kuberl_sandbox.suites.swe_toy import generate

TASKS = generate(12, seed=5)


def play(sandbox, task, edit: str | None, intermediate: bool = True):
    async def episode():
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"), intermediate_rewards=intermediate)
        observations = [await env.reset(task)]
        results = []
        calls = [ToolCall(name="read_file", arguments={"path": task.metadata["file"]}), ToolCall(name="run_tests")]
        if edit is not None:
            calls.append(
                ToolCall(
                    name="replace",
                    arguments={"path": task.metadata["file"], "old": task.metadata["buggy"], "new": edit},
                )
            )
        calls += [ToolCall(name="run_tests"), ToolCall(name="submit")]
        for call in calls:
            results.append(await env.step(call))
        await env.close()
        await client.aclose()
        return observations, results

    return asyncio.run(episode())


def test_the_fix_earns_full_reward_and_the_edit_turn_is_credited(sandbox):
    task = TASKS[0]
    observations, results = play(sandbox, task, task.metadata["fix"])
    assert task.prompt in observations[0] and task.metadata["file"] in observations[0]
    read, first_tests, edit, second_tests, submit = results
    assert task.metadata["buggy"] in read.observation
    assert task.metadata["fix"] in first_tests.observation  # the error names the right edit
    assert first_tests.reward is None  # no baseline yet
    assert edit.observation == f"Replaced 1 occurrence(s) in {task.metadata['file']}."
    assert second_tests.reward > 0  # visible tests went from failing to passing
    assert submit.done and submit.reward == 1.0


def test_a_wrong_edit_earns_partial_reward(sandbox):
    task = TASKS[1]
    wrong = next(c for c in task.metadata["candidates"] if c != task.metadata["fix"])
    _, results = play(sandbox, task, wrong)
    assert results[-1].done and 0.0 <= results[-1].reward < 1.0


def test_submitting_without_editing_scores_the_buggy_code(sandbox):
    _, results = play(sandbox, TASKS[2], None, intermediate=False)
    assert all(r.reward is None for r in results[:-1])
    assert 0.0 <= results[-1].reward < 1.0


def test_metrics_count_sessions_and_commands(sandbox):
    text = httpx.get(sandbox.url + "/metrics").text
    for name in (
        "kuberl_sandbox_sessions_open",
        "kuberl_sandbox_sessions_created_total",
        'kuberl_sandbox_commands_total{kind="tests"}',
        'kuberl_sandbox_commands_total{kind="hidden_tests"}',
        "kuberl_sandbox_command_duration_seconds_bucket",
        "kuberl_sandbox_command_timeouts_total",
    ):
        assert name in text, name


def test_test_output_is_the_same_for_the_same_workspace(sandbox):
    async def twice():
        client = SandboxClient(sandbox.url, sandbox.token)
        sid = (await client.create_session(TASKS[4]))["sessionId"]
        outputs = [(await client.run_tests(sid))["output"] for _ in range(2)]
        await client.close(sid)
        await client.aclose()
        return outputs

    first, second = asyncio.run(twice())
    assert first == second and re.search(r"^Ran \d+ tests?$", first, re.MULTILINE) and " in 0." not in first
