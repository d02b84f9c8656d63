"""OpenEnv environments through KubeRL's environment protocol (kuberl/integrations/openenv_adapter.py): the name
rule of `spec.environment.name`, the action as the model's one tool, tasks as reset arguments, the environment's
rewards through the job's reward function, and an environment that raises failing only its own episodes.
The end-to-end run (a real rollout server and learner steps) is tests/rollout/test_openenv_training.py."""

from __future__ import annotations

import asyncio
import random

import pytest
from conftest import with_spec
from helpers.openenv_envs import FallsOverOnReset, FallsOverOnStep, GridWalk

from kuberl.api.environment import ScoredEnvironment, Task, ToolCall
from kuberl.api.spec import openenv_class
from kuberl.integrations import openenv_guess
from kuberl.integrations.openenv_adapter import (
    OpenEnvEnvironment,
    OpenEnvEnvironments,
    openenv_system_prompt,
    resolve_openenv_class,
)
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, format_tool_call
from kuberl.rewards import resolve_reward
from kuberl.suites import load_tasks
from kuberl.validation import validate_document
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.engine import Generation
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.service import RolloutService

GUESS = "openenv:kuberl.integrations.openenv_guess:GuessNumberEnvironment"
RETURN = resolve_reward("openenv-return")


def guess(number: object) -> ToolCall:
    return ToolCall(name="guess", arguments={"number": number})


def seed_task(seed: int, **reset_args: object) -> Task:
    metadata = {"seed": seed, **({"resetArgs": reset_args} if reset_args else {})}
    return Task(task_id=f"seed-{seed}", prompt="unused", metadata=metadata)


# ------------------------------------------------------------------------------------------ the name rule
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("openenv:helpers.nowhere:Env", "cannot import module 'helpers.nowhere'"),
        ("openenv:helpers.openenv_envs:Missing", "module 'helpers.openenv_envs' has no attribute 'Missing'"),
        ("openenv:helpers.openenv_envs:NotAnEnvironment", "is not a subclass of openenv.core.env_server.Environment"),
        ("openenv:helpers.openenv_envs:Untyped", "cannot tell its action type; declare the class as Environment["),
        ("openenv:GuessNumberEnvironment", "must be a built-in environment such as 'swe-toy', or openenv:module:Class"),
        ("swe toy", "must be a built-in environment such as 'swe-toy'"),
    ],
)
def test_a_bad_environment_name_is_refused_at_the_door_naming_the_field(name, problem):
    manifest = with_spec(environment={"name": name}, reward={"function": "openenv-return"})
    result = validate_document(manifest, "job.yaml")
    assert [(p.path, problem in p.message) for p in result.problems] == [("spec.environment.name", True)], [
        str(p) for p in result.problems
    ]


def test_an_openenv_name_names_a_class_and_its_tasks_are_reset_seeds():
    assert openenv_class(GUESS) == "kuberl.integrations.openenv_guess:GuessNumberEnvironment"
    assert openenv_class("swe-toy") is None
    assert validate_document(with_spec(environment={"name": GUESS}, reward={"function": "openenv-return"}), "j").ok
    tasks = load_tasks(GUESS, count=8)
    assert [t.task_id for t in tasks] == [f"seed-{i}" for i in range(8)]
    assert [t.metadata["seed"] for t in tasks] == list(range(8))
    assert [t.task_id for t in tasks if t.split == "test"] == ["seed-3", "seed-7"]
    assert load_tasks(GUESS, count=4) == tasks[:4]  # task i is the same whatever the count


def test_the_action_is_the_one_tool_the_prompt_describes_in_the_project_tool_call_syntax():
    prompt = openenv_system_prompt(resolve_openenv_class("helpers.openenv_envs:GridWalk"))
    assert prompt.startswith("Walk a grid; the reset arguments say where to start. Each turn, call exactly one tool")
    assert "Tools: move(direction, steps)." in prompt  # MoveAction -> move; openenv's `metadata` is no argument
    swe_shape = SWE_SYSTEM_PROMPT.split("Tools:")[0].removeprefix("You fix bugs in small Python repositories.")
    assert swe_shape in prompt  # the same call syntax the parser reads


# ------------------------------------------------------------------------------------------ the adapter
async def play(env: ScoredEnvironment, task: Task, calls: list[ToolCall]) -> list:
    results = [await env.reset(task)]
    for call in calls:
        result = await env.step(call)
        results.append(result)
        if result.done:
            break
    return results


async def test_an_episode_of_the_guessing_game_is_scored_by_the_job_reward_function():
    secret = random.Random(5).randint(1, 8)
    wrong = 1 if secret != 1 else 2
    env = OpenEnvEnvironments(openenv_guess.GuessNumberEnvironment, RETURN).open()
    assert isinstance(env, ScoredEnvironment)
    first, *steps = await play(env, seed_task(5), [guess("five"), ToolCall(name="bet"), guess(wrong), guess(secret)])
    assert first == "I picked a number from 1 to 8. You have 4 guesses." and env.session_id is not None
    bad_args, bad_tool, miss, hit = steps
    assert bad_args.observation.startswith("error: bad arguments (number: ") and not bad_args.done
    assert bad_tool.observation == "error: unknown tool 'bet'; the one tool is guess(number)"
    assert miss.observation.startswith(f"{wrong}: ") and miss.reward is None  # no intermediate reward asked for
    assert miss.info["environmentReward"] == 0.0
    assert (hit.observation, hit.done, hit.reward) == (f"{secret} is right!", True, 1.0)
    assert env.final_reward() == 1.0 and env.resolved() is None and env.tampering() is None
    await env.close()
    assert env.session_id is None


async def test_reset_arguments_come_from_the_task_and_every_reward_the_environment_gave_counts():
    env = OpenEnvEnvironments(GridWalk, RETURN).open()
    east = ToolCall(name="move", arguments={"direction": "east"})
    first, *steps = await play(env, seed_task(0, x=1, y=7), [east] * 3)
    assert first == '{"x": 1, "y": 7}'  # the observation's own fields, without reward, done and metadata
    assert [s.observation for s in steps] == ['{"x": 2, "y": 7}', '{"x": 3, "y": 7}']
    assert steps[-1].done and env.final_reward() == 1.0  # 0.5 + 0.5: the episode's return


async def test_an_environment_that_raises_fails_the_call_with_a_message_naming_class_and_method():
    env = OpenEnvEnvironment(FallsOverOnStep, RETURN)
    await env.reset(seed_task(0))
    await env.step(guess(9))
    with pytest.raises(Exception, match=r"FallsOverOnStep.step raised ConnectionError: the game's backend went away"):
        await env.step(guess(2))


# ------------------------------------------------------------------------------------------ in the service
class CharTokenizer:
    eos_token_id = 0

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids if i)


class CountingEngine:
    """Guesses 1, 2, 3, ... in every episode (a policy that ignores the hints)."""

    async def generate(self, prompt_ids, max_tokens, **sampling) -> Generation:
        turn = "".join(chr(i) for i in prompt_ids).count("<assistant>")
        ids = [ord(c) for c in format_tool_call(guess(turn))] + [0]
        return Generation(ids, [-0.5] * len(ids), [0] * len(ids), "stop")


class SeedRecordingEngine(CountingEngine):
    """CountingEngine that keeps the sampling seed of every call."""

    def __init__(self) -> None:
        self.seeds: list[int | None] = []

    async def generate(self, prompt_ids, max_tokens, **sampling) -> Generation:
        self.seeds.append(sampling.get("seed"))
        return await super().generate(prompt_ids, max_tokens, **sampling)


def service(env_class: type, engine: CountingEngine | None = None) -> RolloutService:
    environments = OpenEnvEnvironments(env_class, RETURN)
    agent = Agent(
        engine or CountingEngine(), ChatFormat(CharTokenizer()), environments.system_prompt, EpisodeLimits(max_turns=4)
    )
    tasks = {t.task_id: t for t in load_tasks(GUESS, count=8)}
    return RolloutService(agent, environments.open, RETURN, tasks, 4, RolloutMetrics())


async def take_all(rollout: RolloutService, count: int) -> list:
    found: list = []
    async with asyncio.timeout(30):
        while len(found) < count:
            found += await rollout.take(16, wait_s=1)
    assert await rollout.take(16, wait_s=0.2) == []  # nothing delivered twice
    return found


async def test_the_built_in_agent_plays_openenv_episodes_with_env_rewards_turns_and_loss_mask():
    rollout = service(openenv_guess.GuessNumberEnvironment)
    groups = [rollout.submit(f"seed-{s}", None, 2) for s in range(4)]
    trajectories = await take_all(rollout, 8)
    for t in trajectories:
        secret = random.Random(int(t.task_id.removeprefix("seed-"))).randint(1, 8)
        solved = secret <= 4  # guesses 1..4 find secrets up to 4
        assert t.error is None and t.final_reward == (1.0 if solved else 0.0)
        assert len(t.turns) == min(secret, 4) and t.finish_reason == "submitted"  # the environment said done
        assert t.sandbox_session_id is not None  # the episode id the environment was reset with
        for turn in t.turns:
            assert t.loss_mask[turn.start : turn.action_end] == [1] * (turn.action_end - turn.start)
            assert set(t.loss_mask[turn.action_end : turn.end]) <= {0} and turn.tool == "guess"
        text = "".join(chr(i) for i in t.token_ids[: t.prompt_length])
        assert "I picked a number from 1 to 8" in text and "Tools: guess(number)" in text
    assert [rollout.describe(g.group_id).failed for g in groups] == [0, 0, 0, 0]


async def test_every_turn_of_every_episode_of_a_group_samples_with_a_seed_of_its_own():
    # the game's prompt is the same for every seed: episodes that share a turn's sampling seed make the same call
    engine = SeedRecordingEngine()
    rollout = service(openenv_guess.GuessNumberEnvironment, engine)
    rollout.submit("seed-5", None, 8, seed=3)  # secret 5: every episode takes all 4 turns
    rollout.submit("seed-7", None, 8, seed=4)  # secret 6
    await take_all(rollout, 16)
    assert len(engine.seeds) == 16 * 4 and None not in engine.seeds
    assert len(set(engine.seeds)) == len(engine.seeds)


@pytest.mark.parametrize(
    ("env_class", "reason"),
    [
        (FallsOverOnStep, "FallsOverOnStep.step raised ConnectionError: the game's backend went away"),
        (FallsOverOnReset, "FallsOverOnReset.reset raised KeyError: 'no level for seed 3'"),
    ],
)
async def test_an_environment_that_raises_fails_its_episodes_with_the_reason_and_the_server_goes_on(env_class, reason):
    rollout = service(env_class)
    group = rollout.submit("seed-3", None, 3)
    trajectories = await take_all(rollout, 3)
    assert len({t.trajectory_id for t in trajectories}) == 3
    for t in trajectories:
        assert (t.finish_reason, t.final_reward) == ("error", 0.0)
        assert t.error == f"environment failed: OpenEnv environment {reason}"
    assert rollout.describe(group.group_id).failed == 3
    again = rollout.submit("seed-1", None, 1)  # the service still serves
    assert len(await take_all(rollout, 1)) == 1 and rollout.describe(again.group_id).finished == 1
