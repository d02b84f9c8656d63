"""From trajectories to tensors: turn structure, group ids, and the row shards of each rank."""

from __future__ import annotations

import torch
from conftest import with_spec

from kuberl.api.rljob import RLJob
from kuberl.api.trajectory import Trajectory, Turn
from kuberl_trainer.batching import collate, filters_uniform_groups, group_advantages, has_signal, shard, with_gae


def trajectory(group: str, index: int, reward: float, turn_rewards=(0.0, 0.0)) -> Trajectory:
    # 2 prompt tokens | turn 0: 2 generated + 1 observation | turn 1: 2 generated
    return Trajectory(
        trajectory_id=f"{group}{index}",
        task_id="t",
        group_id=group,
        token_ids=[1, 2, 3, 4, 5, 6, 7],
        loss_mask=[0, 0, 1, 1, 0, 1, 1],
        logprobs=[0, 0, -1, -1, 0, -1, -1],
        policy_versions=[-1, -1, 0, 0, -1, 0, 0],
        prompt_length=2,
        turns=[
            Turn(start=2, action_end=4, end=5, reward=turn_rewards[0]),
            Turn(start=5, action_end=7, end=7, reward=turn_rewards[1]),
        ],
        final_reward=reward,
        finish_reason="submitted",
    )


BATCH = [
    trajectory("a", 0, 1.0),
    trajectory("a", 1, 0.0),
    trajectory("b", 0, 1.0),
    trajectory("b", 1, 1.0),
    trajectory("c", 0, 0.0),
]


def test_collate_records_turns_and_groups():
    c = collate(BATCH, pad_id=0)
    assert c.turn_index[0].tolist() == [-1, -1, 0, 0, -1, 1, 1]
    assert c.turn_starts[0].tolist() == [2, 5] and c.turn_valid.all()
    assert c.group_ids.tolist() == [0, 0, 1, 1, 2]


def test_outcome_grpo_advantages_by_group():
    spec = RLJob.from_manifest(with_spec(algorithm={"groupSize": 2})).spec
    adv = group_advantages(collate(BATCH, 0), spec.algorithm)
    assert adv[0, 2] > 0 > adv[1, 2]  # success vs failure within group a
    assert adv[2].abs().max() == 0  # group b: all solved, nothing to learn
    assert adv[0, 4] == 0  # observation token


def test_ppo_outcome_credit_uses_token_level_gae():
    credit = {"gamma": 1.0, "lambda": 1.0}
    spec = RLJob.from_manifest(with_spec(algorithm={"name": "ppo", "groupSize": 1, "creditAssignment": credit})).spec
    c = collate(BATCH, 0)
    out = with_gae(c, torch.zeros(5, 7), spec.algorithm)
    assert out.advantages[0].tolist() == [0, 0, 1, 1, 0, 1, 1]  # V = 0: the return on every generated token
    assert out.value_mask[0].tolist() == [False, True, True, False, True, True, False]


def test_shards_cover_every_row_once_and_pad_to_equal_sizes():
    c = collate(BATCH, 0)
    parts = [shard(c, rank, 2, multiple=2) for rank in range(2)]
    assert [p.batch.input_ids.shape[0] for p in parts] == [4, 4]  # 3 and 2 real rows, padded to 4
    real = [int(p.batch.loss_mask.any(dim=1).sum()) for p in parts]
    assert real == [3, 2]
    assert sum(int(p.batch.loss_mask.sum()) for p in parts) == int(c.batch.loss_mask.sum())


# ------------------------------------------------------------------------------------ dynamic sampling
def algorithm(**fields):
    return RLJob.from_manifest(with_spec(algorithm={"groupSize": 2, **fields})).spec.algorithm


def test_a_group_has_signal_when_its_outcome_rewards_differ():
    assert has_signal([trajectory("a", 0, 1.0), trajectory("a", 1, 0.0)], algorithm())
    assert not has_signal([trajectory("b", 0, 1.0), trajectory("b", 1, 1.0)], algorithm())
    assert not has_signal([trajectory("b", 0, 0.3), trajectory("b", 1, 0.3 + 1e-9)], algorithm())  # noise, not signal
    assert not has_signal([trajectory("c", 0, 0.7)], algorithm(name="rloo"))  # one member: no baseline


def test_with_turn_credit_differing_intermediate_rewards_are_signal():
    # the same outcome, but one trajectory's first turn fixed a test: per-turn returns differ
    group = [trajectory("a", 0, 1.0, turn_rewards=(0.5, 0.0)), trajectory("a", 1, 1.0)]
    assert has_signal(group, algorithm(creditAssignment={"mode": "turn"}))
    assert not has_signal(group, algorithm())  # outcome credit sees the outcome only
    for spec in (algorithm(creditAssignment={"mode": "turn"}), algorithm()):  # what the advantages say, too
        zero = group_advantages(collate(group, 0), spec).abs().max() == 0
        assert zero == (not has_signal(group, spec))


def test_dynamic_sampling_filters_for_group_baselines_only():
    assert filters_uniform_groups(algorithm()) and filters_uniform_groups(algorithm(name="rloo"))
    assert not filters_uniform_groups(algorithm(dynamicSampling=False))
    assert not filters_uniform_groups(algorithm(name="ppo"))  # the value head's baseline still gives advantages
