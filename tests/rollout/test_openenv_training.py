"""An OpenEnv environment trained end to end (issue 21, item 4): a real rollout server (vLLM on CPU) whose job
names the number-guessing game (`spec.environment.name: openenv:...GuessNumberEnvironment`, reward
`openenv-return`) plays its episodes with the built-in agent loop, and the learner's own code trains a tiny
model on them for a few steps, publishing the new weights between. The model is first taught the tool-call
syntax with random guesses (a random tiny model never writes a tool call), as the demo's warm-up does.

Checked: every trajectory came from the game (its reset text in the prompt, its answers as the observations, the
reward the game's rule gives for the guesses the model made), the loss mask covers exactly the generated calls,
every token was sampled by the weights of the step before, and the learner's log-probs match the sampled ones."""

from __future__ import annotations

import random
import time

import pytest
import torch
from helpers.agent_server import agent_server
from transformers import AutoTokenizer

from kuberl.api.environment import ToolCall
from kuberl.api.spec import AlgorithmSpec, FsdpSpec
from kuberl.api.trajectory import Trajectory
from kuberl.integrations.openenv_adapter import openenv_system_prompt
from kuberl.integrations.openenv_guess import GUESSES, HIGH, LOW, GuessNumberEnvironment
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tiny import build_tiny_model
from kuberl.modeling.tool_calls import ParseError, format_tool_call, parse_tool_call
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import collate, group_advantages
from kuberl_trainer.export import policy_buckets
from kuberl_trainer.policy import load_policy
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.sft import supervised_fit
from kuberl_trainer.step import predict, train_step

pytestmark = pytest.mark.slow

NAME = "openenv:kuberl.integrations.openenv_guess:GuessNumberEnvironment"
STEPS = 3
GROUPS, GROUP_SIZE = 4, 4


def warmed_up_model(folder):
    """The tiny model after 300 supervised steps on first guesses from LOW to HIGH in the tool-call syntax."""
    model = build_tiny_model(folder / "random", hidden_size=64, layers=2, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat, rng = ChatFormat(tokenizer), random.Random(0)
    system = openenv_system_prompt(GuessNumberEnvironment)
    examples = []
    for seed in range(64):
        opening = GuessNumberEnvironment().reset(seed=seed).message
        prompt = chat.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": opening}])
        call = format_tool_call(ToolCall(name="guess", arguments={"number": rng.randint(LOW, HIGH)}))
        answer = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]
        examples.append((prompt + answer, [0] * len(prompt) + [1] * len(answer)))
    supervised_fit(model, examples, folder / "warm", steps=300, batch_size=8)
    return folder / "warm"


@pytest.fixture(scope="module")
def guess_server(sandbox, tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    spec = {
        "environment": {"name": NAME, "tasks": {"count": 32}},
        "reward": {"function": "openenv-return"},
        "rollout": {"maxTokensPerTurn": 40},
    }
    with agent_server(sandbox, folder, None, GUESSES, model=warmed_up_model(folder), spec=spec) as server:
        yield server


def game_reward(seed: int, guesses: list[int | None]) -> float:
    """The game's own rule: 1.0 when one of the (at most GUESSES) valid guesses hit the seed's secret."""
    secret = random.Random(seed).randint(LOW, HIGH)
    return 1.0 if secret in [g for g in guesses if g is not None][:GUESSES] else 0.0


def check_came_from_the_game(t: Trajectory, tokenizer, step: int) -> None:
    assert t.error is None, t.error
    prompt = tokenizer.decode(t.token_ids[: t.prompt_length])
    assert "I picked a number from 1 to 8. You have 4 guesses." in prompt and "Tools: guess(number)." in prompt
    guesses: list[int | None] = []
    for turn in t.turns:
        generated = t.token_ids[turn.start : turn.action_end]
        assert t.loss_mask[turn.start : turn.action_end] == [1] * len(generated)
        assert t.loss_mask[turn.action_end : turn.end] == [0] * (turn.end - turn.action_end)
        call = parse_tool_call(tokenizer.decode(generated, skip_special_tokens=True))
        number = None if isinstance(call, ParseError) or call.name != "guess" else call.arguments.get("number")
        valid = isinstance(number, int)
        guesses.append(number if valid else None)
        answer = tokenizer.decode(t.token_ids[turn.action_end : turn.end])
        if valid and turn.end > turn.action_end:  # the game's answer to the guess, as the next observation
            assert any(word in answer for word in ("higher", "lower")), answer
    seed = int(t.task_id.removeprefix("seed-"))
    assert t.final_reward == game_reward(seed, guesses), (guesses, t.final_reward)
    assert t.finish_reason == ("submitted" if t.final_reward == 1.0 else t.finish_reason)  # a win ends the episode
    generated_versions = {v for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m}
    assert generated_versions == {step - 1}


def test_a_tiny_model_trains_a_few_steps_on_an_openenv_game(guess_server):
    rollout = RolloutClient([guess_server["url"]])
    tokenizer = AutoTokenizer.from_pretrained(guess_server["model"])
    model = load_policy(str(guess_server["model"]), FsdpSpec(activation_checkpointing=False), torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    rewards, valid_calls = [], []
    for step in range(1, STEPS + 1):
        seeds = [(step * GROUPS + g) % 32 for g in range(GROUPS)]
        groups = {rollout.submit(f"seed-{s}", size=GROUP_SIZE, seed=step).group_id for s in seeds}
        trajectories = collect(rollout, groups, GROUPS * GROUP_SIZE)
        for t in trajectories:
            check_came_from_the_game(t, tokenizer, step)
        rewards.append(sum(t.final_reward for t in trajectories) / len(trajectories))
        valid_calls.append(sum(turn.tool == "guess" for t in trajectories for turn in t.turns))
        collated = collate(trajectories, pad_id=0)
        collated.batch.advantages = group_advantages(collated, AlgorithmSpec(group_size=GROUP_SIZE))
        mask = collated.batch.loss_mask
        learner = predict(model, collated.batch).logprobs[mask]
        assert (learner - collated.batch.rollout_logprobs[mask]).abs().max() < 1e-2  # the sampled ids, in context
        report = train_step(model, optimizer, collated.batch, LossConfig(), 1.0, 1)
        assert report.tokens == sum(t.generated_tokens for t in trajectories) and report.skipped == 0
        assert rollout.publish(step, policy_buckets(model)) == [0]
    assert sum(valid_calls) > 0 and any(r > 0 for r in rewards)  # the game was played, and sometimes won
    print(f"\nopenenv guess: mean reward by step {rewards}, guesses the game answered by step {valid_calls}")


def collect(rollout: RolloutClient, groups: set[str], count: int, timeout: float = 240.0) -> list[Trajectory]:
    found: list[Trajectory] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += [t for t in rollout.collect(wait=2.0).trajectories if t.group_id in groups]
    assert len(found) == count, f"{len(found)} of {count} trajectories arrived"
    assert len({t.trajectory_id for t in found}) == count  # none twice
    return found
