"""Learning regression: a short, real RL run with the learner's own code learns, and stops learning when
learning is broken; the trained policy credits the edit, not the check.

The task (helpers/toy_rl.py) is the seed's credit-assignment episode in miniature: first check the error
(`run_tests`, always the same call), whose message quotes the right value and the buggy one; then an edit
(`replace`) that must copy the right value. A tiny Llama is warmed up as the demo is (supervised; 30% of
the demonstrations make the right edit, the rest copy the buggy value), then trained with GRPO and turn
credit (the demo's settings) on episodes sampled in-process: `load_policy`, `collate`, `group_advantages`,
dynamic sampling and `train_step`, called as `run_learner` calls them. Everything is seeded and runs on one
thread, so a run repeats exactly on one machine; the margins leave room for another machine's numerics.

Measured (warm-up seeds 0 and 1, RL seeds 1, 2 and 7): the warmed-up policy solves 0.19-0.25 of held-out
episodes; RL raises the mean reward of the first 5 steps (0.23-0.40) by 0.40-0.56 and the held-out solve rate
to 0.73-0.85; with the advantages' sign flipped, or random rewards, the reward falls (to 0 in most runs).
On held-out tasks log P(right edit) rises 1.35-1.95 nats and log P(check) moves by at most 0.02. A warm-up
whose copying had only half formed (seed 2: the buggy value copied in 0.66 of edits, not 0.87-0.93) rose
by only 0.19.

The check barely moves because it is the same action in every episode of a group, so its group-relative
advantages sum to zero. With no intermediate rewards, turn credit gives it the same advantages as outcome
credit (per-turn returns are the outcome scaled by gamma, and GRPO divides the scale out): an outcome run
measured the same to the last digit, and PPO with GAE credit gave +1.91 and +0.003 nats.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.toy_rl import RunResult, demonstrations, probes, rl_run, split_tasks, success_rate
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.api.rljob import RLJob
from kuberl.modeling.chat import ChatFormat
from kuberl_trainer.sft import supervised_fit
from recipes.swe_toy.action_probes import CHECK, EDIT, mean_logprobs
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

SEED = 0
EXPERT_FRACTION = 0.3  # the swe-toy recipe's --expert-fraction in miniature
RL_STEPS = 30
CONTROL_STEPS = 15
"""The broken runs are shorter, for runtime: by step 15 the real run's reward has risen by 0.19-0.37 over its
first 5 steps, and the broken runs' has fallen."""
WINDOW = 5
"""Steps averaged at each end of a run: one step's 64 episodes of 8 tasks are a noisy measure."""
MARGIN = 0.3
"""A rise that counts as learning: measured 0.40-0.56 (first to last 5 steps) and 0.50-0.66 in the held-out
solve rate."""
EPISODES_PER_TASK = 8


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # On 2 cores shared with other work, torch's intra-op threads wait on each other (a step ~10x slower);
    # one thread also makes the run repeat exactly.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tasks():
    return split_tasks()


@pytest.fixture(scope="module")
def warmed(tmp_path_factory, tasks) -> Path:
    """The tiny model after the supervised warm-up (~45 s of one core)."""
    folder = tmp_path_factory.mktemp("learning")
    base = build_tiny_model(folder / "base", hidden_size=64, layers=2, heads=2, seed=SEED)
    chat = ChatFormat(AutoTokenizer.from_pretrained(base))
    examples = demonstrations(chat, tasks[0], 800, EXPERT_FRACTION, seed=SEED)
    supervised_fit(base, examples, folder / "warm", steps=600, learning_rate=3e-3, batch_size=16, seed=SEED)
    return folder / "warm"


def job_for(model: Path) -> RLJob:
    """GRPO with turn credit, as examples/swe-toy.yaml; a learning rate for the tiny model."""
    return RLJob.model_validate(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "learning"},
            "spec": {
                "model": {"uri": str(model), "dtype": "float32"},
                "algorithm": {"name": "grpo", "groupSize": 8, "creditAssignment": {"mode": "turn", "gamma": 0.9}},
                "training": {"trajectoriesPerStep": 64, "learningRate": 5e-4, "seed": 7},
            },
        }
    )


@pytest.fixture(scope="module")
def trained(warmed, tasks) -> RunResult:
    """The RL run (~50 s of one core)."""
    return rl_run(job_for(warmed), warmed, tasks[0], RL_STEPS)


def first_and_last(rewards: list[float]) -> tuple[float, float]:
    return sum(rewards[:WINDOW]) / WINDOW, sum(rewards[-WINDOW:]) / WINDOW


def held_out_success(model, chat: ChatFormat, held_out) -> float:
    torch.manual_seed(0)
    return success_rate(model, chat, held_out, EPISODES_PER_TASK)


def load(path: Path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def test_the_warmed_up_policy_solves_some_held_out_tasks_and_fails_others(warmed, tasks):
    """GRPO learns only from groups that disagree: the warm-up must leave room both ways."""
    chat = ChatFormat(AutoTokenizer.from_pretrained(warmed))
    rate = held_out_success(load(warmed), chat, tasks[1])
    print(f"\nwarmed-up policy: held-out solve rate {rate:.3f}")
    assert 0.05 <= rate <= 0.6


def test_rl_raises_the_reward_and_the_held_out_solve_rate(warmed, trained, tasks):
    first, last = first_and_last(trained.rewards)
    chat = ChatFormat(AutoTokenizer.from_pretrained(warmed))
    before, after = held_out_success(load(warmed), chat, tasks[1]), held_out_success(trained.model, chat, tasks[1])
    print(f"\nrewards per step: {[round(r, 2) for r in trained.rewards]} ({trained.seconds:.0f}s)")
    print(f"reward: first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}")
    print(f"held-out solve rate: {before:.3f} -> {after:.3f}")
    assert last - first >= MARGIN
    assert after - before >= MARGIN


@pytest.mark.parametrize("control", ["flip-advantages", "random-rewards"])
def test_broken_learning_does_not_raise_the_reward(warmed, tasks, control):
    """Negative controls, so that the test above can fail: the same run with the advantages' sign flipped, or
    with random rewards that ignore the action, does not raise the reward. Flipped, it falls: the right edit
    is pushed away. Random rewards also pay garbled calls, so the tool-call format decays in most runs."""
    result = rl_run(job_for(warmed), warmed, tasks[0], CONTROL_STEPS, control=control)
    first, last = first_and_last(result.rewards)
    print(f"\n{control}: rewards per step {[round(r, 2) for r in result.rewards]} ({result.seconds:.0f}s)")
    print(f"{control}: first {WINDOW} steps {first:.3f}, last {WINDOW} {last:.3f}")
    assert last - first < 0.1
    if control == "flip-advantages":
        assert last < first


def test_rl_credits_the_edit_not_the_check(warmed, trained, tasks):
    """The seed's credit-assignment check on the trained policy, on held-out tasks: log P(right edit | the
    check and its message) rises; log P(check | prompt), the same action in failed and solved episodes,
    barely moves."""
    chat = ChatFormat(AutoTokenizer.from_pretrained(warmed))
    held_out = probes(chat, tasks[1])
    before, after = mean_logprobs(load(warmed), held_out), mean_logprobs(trained.model, held_out)
    edit, check = after[EDIT] - before[EDIT], after[CHECK] - before[CHECK]
    print(
        f"\nlog P(edit) {before[EDIT]:.3f} -> {after[EDIT]:.3f} ({edit:+.3f}); "
        f"log P(check) {before[CHECK]:.3f} -> {after[CHECK]:.3f} ({check:+.3f})"
    )
    assert edit >= 0.7
    assert abs(check) < 0.1 * edit
