"""The swe-toy recipe's demonstrations: scripted episodes played in a real sandbox and recorded as chat messages
(kuberl.api.demonstrations), laid out by the warm-up exactly as the rollout tier lays out an episode."""

from __future__ import annotations

import asyncio
import random

import pytest

from kuberl.api.demonstrations import Demonstration, Role
from kuberl.api.environment import StepResult, ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import CLOSE, SWE_SYSTEM_PROMPT, ParseError, format_tool_call, parse_tool_call
from kuberl.rewards import resolve_reward
from kuberl.suites import load_tasks
from kuberl_rollout.sandbox_client import SandboxEnvironments
from kuberl_trainer.demonstrations import demonstration_tokens
from recipes.swe_toy.demonstrations import make_demonstrations, record_demonstration
from recipes.swe_toy.scripted_episodes import Slip, WrongEdit, scripted_calls
from recipes.swe_toy.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(build_tokenizer())


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("swe-toy", split="train", count=40)


def scored(sandbox):
    """Environments on the test's sandbox server, scored as the demo's job scores them."""
    return lambda: SandboxEnvironments(sandbox.url, sandbox.token, resolve_reward("swe-toy-tests"))


class Recording:
    """An environment that passes everything to `env` and keeps what it answered."""

    def __init__(self, env) -> None:
        self.env, self.first, self.results = env, "", []

    async def reset(self, task) -> str:
        self.first = await self.env.reset(task)
        return self.first

    async def step(self, action: ToolCall) -> StepResult:
        self.results.append(await self.env.step(action))
        return self.results[-1]


def old_layout(chat: ChatFormat, first: str, calls, results: list[StepResult]) -> tuple[list[int], list[int]]:
    """The token layout the warm-up trained on when it recorded tokens itself, rebuilt from the same answers:
    the prompt, then per call its text and EOS (masked in unless a slip), then the answer and the next header;
    nothing after the step that ended the episode."""
    ids = chat.prompt_ids([{"role": "system", "content": SWE_SYSTEM_PROMPT}, {"role": "user", "content": first}])
    mask = [0] * len(ids)
    eos = chat.tokenizer.eos_token_id
    answers = iter(results)
    for call in calls:
        slip = isinstance(call, Slip)
        text = call.text if slip else format_tool_call(call)
        action = [*chat.tokenizer.encode(text, add_special_tokens=False), eos]
        ids += action
        mask += [0 if slip else 1] * len(action)
        parsed = parse_tool_call(text) if slip else call
        if isinstance(parsed, ParseError):
            observation = parsed.message
        else:
            result = next(answers)
            if result.done:
                break
            observation = result.observation
        observation_ids = chat.observation_ids(observation)
        ids += observation_ids
        mask += [0] * len(observation_ids)
    return ids, mask


def with_slip(task, cut_short: bool) -> list:
    """The expert workflow on `task` with a slipped edit of the kind asked for first."""
    for seed in range(50):
        calls = scripted_calls(task, random.Random(seed), expert=True, recover=True)
        if calls[1].text.endswith(CLOSE) != cut_short:
            return calls
    raise AssertionError("no such slip in 50 seeds")


def test_a_recorded_demonstration_has_the_token_layout_the_warm_up_always_trained_on(sandbox, chat, tasks):
    rng = random.Random(3)
    plans = [
        scripted_calls(tasks[0], rng, expert=True),
        scripted_calls(tasks[1], rng, wrong=WrongEdit.UNCHANGED),
        scripted_calls(tasks[2], rng, wrong=WrongEdit.CANDIDATE),
    ]
    # both kinds of slip: a call cut short (a parse error) and `old` set to the fix (the sandbox's error)
    plans += [with_slip(tasks[3], cut_short=True), with_slip(tasks[3], cut_short=False)]

    async def play(task, calls):
        opened = scored(sandbox)()
        env = Recording(opened.open())
        try:
            played = await record_demonstration(env, SWE_SYSTEM_PROMPT, task, calls)
        finally:
            await env.env.close()
            await opened.aclose()
        return played, env

    for task, calls in zip([*tasks[:3], tasks[3], tasks[3]], plans, strict=True):
        played, env = asyncio.run(play(task, calls))
        assert played.finished
        tokens = demonstration_tokens(played.demonstration, chat)
        assert (tokens.token_ids, tokens.loss_mask) == old_layout(chat, env.first, calls, env.results)
        trained = [m.content for m in played.demonstration.messages if m.role == Role.ASSISTANT and m.train]
        assert trained == [format_tool_call(c) for c in calls if not isinstance(c, Slip)]


def test_the_demonstrations_follow_the_plan_and_keep_the_reward(sandbox, tasks):
    kwargs = dict(seed=1, expert_fraction=0.5, recovery_fraction=0.3, wrong_edit=WrongEdit.UNCHANGED)
    demos = asyncio.run(make_demonstrations(tasks[:6], 8, scored(sandbox), **kwargs))
    assert all(isinstance(d, Demonstration) for d in demos) and len(demos) == 8
    # the expert half spread evenly, every one solving its task; the unchanged edit never does
    assert [d.reward for d in demos] == [0.0, 1.0] * 4
    assert len({d.task_id for d in demos}) == 6  # a shuffled cycle over the tasks
    for demo in demos:
        messages = demo.messages
        assert [m.role for m in messages[:2]] == [Role.SYSTEM, Role.USER]
        assert messages[0].content == SWE_SYSTEM_PROMPT
        assert parse_tool_call(messages[-1].content).name == "submit"  # nothing after the step that ended it
        trained = [m.train for m in messages if m.role == Role.ASSISTANT]
        assert trained in ([True] * 4, [True, False, True, True, True])  # a slip is shown, not trained on
    assert any(len(d.messages) > 10 for d in demos)  # some recover from a slip
    again = asyncio.run(make_demonstrations(tasks[:6], 8, scored(sandbox), **kwargs))
    assert [d.task_id for d in again] == [d.task_id for d in demos]
    assert [len(d.messages) for d in again] == [len(d.messages) for d in demos]


class NeverEnds:
    """Environments whose episodes never end: a scripted call the sandbox would have refused."""

    def open(self):
        return self

    async def reset(self, task) -> str:
        return task.prompt

    async def step(self, action) -> StepResult:
        return StepResult(observation="error: refused")

    async def close(self) -> None:
        pass

    async def aclose(self) -> None:
        pass


def test_an_episode_that_never_submits_is_refused(tasks):
    with pytest.raises(RuntimeError, match="2 demonstrations never reached submit"):
        asyncio.run(make_demonstrations(tasks[:2], 2, NeverEnds))


@pytest.mark.parametrize("fractions", [{"expert_fraction": 1.5}, {"recovery_fraction": -0.1}])
def test_a_fraction_outside_zero_to_one_is_refused(tasks, fractions):
    with pytest.raises(ValueError, match="must be between 0 and 1"):
        asyncio.run(make_demonstrations(tasks[:2], 2, NeverEnds, **fractions))
