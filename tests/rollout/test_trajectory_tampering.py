"""The tampering reason on the trajectory: `SandboxEnvironment.tampering()` reads it from the step results
(`tests.tampering` of run_tests, `hiddenTests.tampering` of submit) and the rollout tier puts it on the
trajectory it records."""

from __future__ import annotations

from kuberl.api.environment import StepResult, ToolCall
from kuberl.api.trajectory import Trajectory
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import format_tool_call
from kuberl.suites.swe_toy import generate
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.engine import Generation
from kuberl_rollout.sandbox_client import SandboxEnvironment

TASK = generate(1, seed=3)[0]


class ScriptedClient:
    """A sandbox client whose session answers each step with the next of `results`."""

    def __init__(self, results: list[StepResult]) -> None:
        self.results = list(results)

    async def create_session(self, task, timeout: float | None = None) -> dict:
        return {"sessionId": "s1", "observation": "start"}

    async def step(self, session_id: str, action: ToolCall) -> StepResult:
        return self.results.pop(0)

    async def close(self, session_id: str) -> None:
        return None


async def tampering_of(*results: StepResult) -> str | None:
    env = SandboxEnvironment(ScriptedClient(list(results)), lambda ctx: 0.0)
    await env.reset(TASK)
    for result in results:
        await env.step(ToolCall(name="submit" if result.done else "run_tests"))
    return env.tampering()


def ran(**report) -> StepResult:
    return StepResult(observation="ran", info={"tests": {"passed": 0, "total": 2, **report}})


def hidden(**report) -> StepResult:
    return StepResult(observation="submitted", done=True, info={"hiddenTests": {"passed": 0, "total": 4, **report}})


async def test_an_honest_episode_has_no_tampering():
    assert await tampering_of(ran(), StepResult(observation="x", info={}), hidden(resolved=False)) is None
    assert await tampering_of() is None  # nothing stepped yet


async def test_the_reason_of_a_forged_submit_is_found():
    assert await tampering_of(ran(), hidden(tampering="missing_answers")) == "missing_answers"


async def test_the_reason_of_a_forged_test_run_is_found_even_after_an_honest_submit():
    assert await tampering_of(ran(tampering="extra_answers"), ran(), hidden()) == "extra_answers"


async def test_the_first_reason_in_step_order_wins():
    forged = [ran(tampering="duplicate_answers"), hidden(tampering="no_report")]
    assert await tampering_of(*forged) == "duplicate_answers"


async def test_a_report_that_is_not_a_mapping_or_an_empty_reason_is_no_tampering():
    odd = StepResult(observation="x", info={"tests": "2/2 passed", "hiddenTests": None})
    assert await tampering_of(odd, ran(tampering=None), hidden(tampering="")) is None


async def test_reset_forgets_the_previous_episode():
    env = SandboxEnvironment(ScriptedClient([hidden(tampering="malformed_report")]), lambda ctx: 0.0)
    await env.reset(TASK)
    await env.step(ToolCall(name="submit"))
    assert env.tampering() == "malformed_report"
    await env.reset(TASK)
    assert env.tampering() is None


class CharTokenizer:
    """One token per character: enough of a tokenizer for the agent loop's chat format."""

    eos_token_id = 0

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i)


class ScriptedEngine:
    """Generates the next of `calls`, as tokens of policy version 3."""

    def __init__(self, calls: list[ToolCall]) -> None:
        self.calls = list(calls)

    async def generate(self, prompt_ids, max_tokens, **sampling) -> Generation:
        ids = [ord(c) for c in format_tool_call(self.calls.pop(0))] + [0]
        return Generation(ids, [-0.5] * len(ids), [3] * len(ids), "stop")


async def episode(*results: StepResult) -> Trajectory:
    calls = [ToolCall(name="submit" if r.done else "run_tests") for r in results]
    agent = Agent(
        ScriptedEngine(calls),
        ChatFormat(CharTokenizer()),
        "fix it",
        EpisodeLimits(max_tokens=100_000, max_tokens_per_turn=1000),
    )
    env = SandboxEnvironment(ScriptedClient(list(results)), lambda ctx: 0.0)
    return await agent.run(env, TASK, group_id="g1")


async def test_the_agent_puts_the_reason_on_the_trajectory():
    forged = await episode(ran(), hidden(tampering="missing_answers", resolved=False))
    assert forged.finish_reason == "submitted" and forged.tampering == "missing_answers"
    wire = Trajectory.model_validate_json(forged.model_dump_json(by_alias=True))
    assert wire.tampering == "missing_answers"
    honest = await episode(ran(), hidden(resolved=False))
    assert honest.finish_reason == "submitted" and honest.tampering is None
    assert "tampering" not in honest.to_manifest()  # absent on the wire when there is none
