"""A whole swe-toy episode through the environment protocol, scored by the registered reward."""

from __future__ import annotations

import asyncio
import re

import httpx

from kuberl.api.environment import ToolCall
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment

TASKS = generate(12, seed=5)


def replace(task, new: str) -> ToolCall:
    """The agent's edit of the buggy expression."""
    return ToolCall(
        name="replace", arguments={"path": task.metadata["file"], "old": task.metadata["buggy"], "new": new}
    )


def play(sandbox, task, *edits: ToolCall, intermediate: bool = True):
    """Read, test, edit, test, submit; returns (observations, results, the environment's resolved verdict)."""

    async def episode():
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"), intermediate_rewards=intermediate)
        observations = [await env.reset(task)]
        results = []
        calls = [ToolCall(name="read_file", arguments={"path": task.metadata["file"]}), ToolCall(name="run_tests")]
        calls += [*edits, ToolCall(name="run_tests"), ToolCall(name="submit")]
        for call in calls:
            results.append(await env.step(call))
        await env.close()
        await client.aclose()
        return observations, results, env.resolved()

    return asyncio.run(episode())


def counts(task, f2p_passed: int, p2p_passed: int) -> dict:
    return {
        "failToPass": {"total": len(task.fail_to_pass), "passed": f2p_passed},
        "passToPass": {"total": len(task.pass_to_pass), "passed": p2p_passed},
    }


def test_the_fix_resolves_the_task_and_the_edit_turn_is_credited(sandbox):
    task = TASKS[0]
    observations, results, resolved = play(sandbox, task, replace(task, task.metadata["fix"]))
    assert task.prompt in observations[0] and task.metadata["file"] in observations[0]
    read, first_tests, edit, second_tests, submit = results
    assert task.metadata["buggy"] in read.observation
    assert task.metadata["fix"] in first_tests.observation  # the error names the right edit
    assert first_tests.reward is None  # no baseline yet
    assert edit.observation == f"Replaced 1 occurrence(s) in {task.metadata['file']}."
    assert second_tests.reward > 0  # visible tests went from failing to passing
    assert submit.done and submit.reward == 1.0 and resolved is True
    hidden = submit.info["hiddenTests"]
    assert hidden["fraction"] == 1.0 and hidden["resolved"] is True
    assert hidden.items() >= counts(task, len(task.fail_to_pass), len(task.pass_to_pass)).items()


def test_a_decoy_fix_resolves_nothing(sandbox):
    task = TASKS[1]
    for decoy in [c for c in task.metadata["candidates"] if c != task.metadata["fix"]]:
        _, results, resolved = play(sandbox, task, replace(task, decoy), intermediate=False)
        hidden = results[-1].info["hiddenTests"]
        assert results[-1].done and results[-1].reward == 0.0 and resolved is False, decoy
        assert hidden["resolved"] is False and hidden["failToPass"]["passed"] < len(task.fail_to_pass)


def test_submitting_without_an_edit_earns_nothing_though_most_hidden_tests_pass(sandbox):
    task = TASKS[2]
    _, results, resolved = play(sandbox, task, intermediate=False)
    assert all(r.reward is None for r in results[:-1])
    hidden = results[-1].info["hiddenTests"]
    assert 0 < hidden["passed"] < hidden["total"]  # what the old fraction reward paid for
    assert hidden.items() >= counts(task, 0, len(task.pass_to_pass)).items()
    assert results[-1].reward == 0.0 and hidden["resolved"] is False and resolved is False


def fixed_and(task, tail: str) -> ToolCall:
    """Write the fixed module with `tail` appended."""
    fixed = task.files[task.metadata["file"]].replace(task.metadata["buggy"], task.metadata["fix"], 1)
    return ToolCall(name="write_file", arguments={"path": task.metadata["file"], "content": fixed + tail})


def test_a_fix_that_breaks_another_function_is_not_resolved(sandbox):
    task = next(t for t in TASKS[3:] if t.metadata["bugKind"] != "swapped-args")  # no helper the fix relies on
    other = task.pass_to_pass[0].rsplit(".", 1)[-1].removeprefix("test_")  # a function the fix must keep working
    _, results, resolved = play(sandbox, task, fixed_and(task, f"\n\ndef {other}(*args):\n    return None\n"))
    hidden = results[-1].info["hiddenTests"]
    assert hidden["failToPass"] == {"total": len(task.fail_to_pass), "passed": len(task.fail_to_pass)}
    assert hidden["passToPass"]["passed"] < len(task.pass_to_pass)
    assert results[-1].reward == 0.0 and hidden["resolved"] is False and resolved is False


def test_a_test_process_that_dies_at_import_passes_nothing(sandbox):
    # Exiting with status 0 before unittest reports anything must not count as passing.
    task = TASKS[4]
    _, results, resolved = play(sandbox, task, fixed_and(task, "\nimport os\n\nos._exit(0)\n"), intermediate=False)
    hidden = results[-1].info["hiddenTests"]
    assert hidden.items() >= counts(task, 0, 0).items() and hidden["passed"] == 0
    assert results[-1].reward == 0.0 and resolved is False


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


def _cached(sandbox, kind: str) -> float:
    text = httpx.get(sandbox.url + "/metrics").text
    return float(re.search(rf'^kuberl_sandbox_test_runs_cached_total{{kind="{kind}"}} (\S+)$', text, re.M).group(1))


def test_byte_identical_files_reuse_an_outcome_and_any_change_runs_the_tests(sandbox):
    task = TASKS[7]

    async def sessions():
        client = SandboxClient(sandbox.url, sandbox.token)
        outcomes = []
        for edit in (None, None, "chmod", "content"):
            sid = (await client.create_session(task))["sessionId"]
            if edit == "chmod":  # the same bytes with other permission bits are other files
                await client.execute(sid, f"chmod 600 {task.metadata['file']}")
            elif edit == "content":
                await client.execute(sid, f"echo '# a comment' >> {task.metadata['file']}")
            before = _cached(sandbox, "tests")
            outcomes.append((await client.run_tests(sid), _cached(sandbox, "tests") - before))
            await client.close(sid)
        await client.aclose()
        return outcomes

    (first, _), (second, reused), (moded, moded_reused), (edited, edited_reused) = asyncio.run(sessions())
    assert second == first and reused == 1  # a group's sessions testing the untouched files: one process
    assert (moded_reused, edited_reused) == (0, 0)
    assert moded["passed"] == edited["passed"] == first["passed"]  # the same verdict, each from a run of its own


def test_a_group_testing_the_same_files_at_once_starts_one_test_process(sandbox):
    task = TASKS[11]

    async def group():
        client = SandboxClient(sandbox.url, sandbox.token)
        sids = [(await client.create_session(task))["sessionId"] for _ in range(4)]
        before = _cached(sandbox, "hidden_tests")
        outcomes = await asyncio.gather(*(client.run_tests(sid, hidden=True) for sid in sids))
        reused = _cached(sandbox, "hidden_tests") - before
        for sid in sids:
            await client.close(sid)
        await client.aclose()
        return outcomes, reused

    outcomes, reused = asyncio.run(group())
    assert reused == 3 and all(o == outcomes[0] for o in outcomes)


def test_the_outcome_cache_keeps_the_newest_and_never_a_timed_out_run():
    from kuberl_sandbox.outcome_cache import OutcomeCache
    from kuberl_sandbox.testrun import TestOutcome

    ran = TestOutcome(total=3, passed=2, output="ok", exit_code=1, timed_out=False)
    cache = OutcomeCache(2)
    cache.put("task", False, "a", ran)
    cache.put("task", False, "b", ran)
    assert cache.get("task", False, "a") is ran  # "a" is now the newest
    cache.put("task", True, "c", ran)
    assert (cache.get("task", False, "b"), len(cache)) == (None, 2)
    assert cache.get("task", False, "c") is None and cache.get("task", True, "c") is ran  # hidden is in the key
    cache.put("task", False, "d", TestOutcome(total=3, passed=0, output="", exit_code=None, timed_out=True))
    assert cache.get("task", False, "d") is None
    off = OutcomeCache(0)
    off.put("task", False, "a", ran)
    assert off.get("task", False, "a") is None


def test_a_sessions_commands_may_take_the_jobs_turn_timeout(sandbox):
    """The sandbox's own limit of one command (30 s) would cut a test run that the turn (environment.turnTimeout)
    still waits for: the environment opens its sessions with the turn's timeout."""

    async def run(command_timeout_s: float | None) -> dict:
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"), command_timeout_s=command_timeout_s)
        await env.reset(TASKS[0])
        result = await env.step(ToolCall(name="run", arguments={"command": "sleep 2; echo done"}))
        await env.close()
        await client.aclose()
        return result.info

    assert asyncio.run(run(1.0))["timedOut"] is True
    assert asyncio.run(run(None)) == {"exitCode": 0, "timedOut": False}
    assert SandboxEnvironment(None, resolve_reward("swe-toy-tests"), command_timeout_s=10_000).command_timeout_s == 600
