"""Advantages and losses against hand-computed examples, for every algorithm and credit option."""

from __future__ import annotations

import math

import pytest
import torch

from kuberl_trainer.algorithms.advantages import (
    gae,
    grpo,
    outcome_to_tokens,
    per_turn_baselined,
    rloo,
    to_tokens,
    turn_returns,
)
from kuberl_trainer.algorithms.losses import LossConfig, aggregate, k3, policy_loss

T = torch.tensor


def test_grpo_normalises_within_each_group():
    rewards, groups = T([1.0, 0.0, 0.0, 1.0, 3.0]), T([0, 0, 0, 0, 1])
    # group 0: mean 0.5, std 0.5 -> +-1; a group of one has no spread -> 0
    assert torch.allclose(grpo(rewards, groups), T([1.0, -1.0, -1.0, 1.0, 0.0]), atol=1e-4)
    assert torch.allclose(grpo(rewards, groups, normalize_std=False), T([0.5, -0.5, -0.5, 0.5, 0.0]))


def test_rloo_uses_the_mean_of_the_others():
    rewards, groups = T([1.0, 0.0, 2.0, 5.0]), T([0, 0, 0, 1])
    # 1 - (0+2)/2 = 0; 0 - (1+2)/2 = -1.5; 2 - (1+0)/2 = 1.5; alone: 0
    assert torch.allclose(rloo(rewards, groups), T([0.0, -1.5, 1.5, 0.0]))


def test_turn_returns_discount_and_add_the_outcome_at_the_last_turn():
    turn_rewards = T([[0.0, 0.5, 0.0], [0.2, 0.0, 0.0]])
    valid = T([[True, True, True], [True, True, False]])
    returns = turn_returns(turn_rewards, valid, final_reward=T([1.0, 0.0]), gamma=0.5)
    # row 0: r = [0, .5, 1] -> G2 = 1, G1 = .5 + .5 = 1, G0 = 0 + .5 = .5 ; row 1: r = [.2, 0] -> [.2, 0]
    assert torch.allclose(returns, T([[0.5, 1.0, 1.0], [0.2, 0.0, 0.0]]))


def test_per_turn_baseline_compares_the_same_turn_across_the_group():
    returns = T([[0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]])
    valid = torch.ones_like(returns, dtype=torch.bool)
    groups = T([0, 0, 0, 0])
    advantages = per_turn_baselined(returns, valid, groups)
    assert torch.allclose(advantages[:, 0], torch.zeros(4))  # the same return everywhere: no credit
    assert torch.allclose(advantages[:, 1], T([1.0, -1.0, 1.0, -1.0]), atol=1e-4)
    loo = per_turn_baselined(returns, valid, groups, estimator="rloo")
    assert torch.allclose(loo[:, 1], T([1 - 1 / 3, -2 / 3, 1 - 1 / 3, -2 / 3]))


def test_gae_matches_the_recursion():
    rewards, values = T([[0.0, 0.0, 1.0]]), T([[0.5, 0.6, 0.8]])
    valid = torch.ones_like(rewards, dtype=torch.bool)
    gamma, lam = 0.9, 0.8
    d2 = 1.0 - 0.8
    d1 = 0.0 + 0.9 * 0.8 - 0.6
    d0 = 0.0 + 0.9 * 0.6 - 0.5
    expected = [d0 + gamma * lam * (d1 + gamma * lam * d2), d1 + gamma * lam * d2, d2]
    assert torch.allclose(gae(rewards, values, valid, gamma, lam), T([expected]), atol=1e-6)
    assert torch.allclose(gae(rewards, values, valid, 1.0, 1.0), T([[0.5, 0.4, 0.2]]), atol=1e-6)  # = G - V


def test_advantages_reach_only_generated_tokens():
    per_turn = T([[2.0, -1.0]])
    turn_index = T([[-1, -1, 0, 0, -1, 1, 1]])  # prompt, turn 0 action, observation, turn 1 action
    assert to_tokens(per_turn, turn_index).tolist() == [[0, 0, 2, 2, 0, -1, -1]]
    assert outcome_to_tokens(T([3.0]), turn_index).tolist() == [[0, 0, 3, 3, 0, 3, 3]]


def test_aggregation_token_mean_and_seq_mean():
    per_token = T([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = T([[1, 1, 1, 1], [1, 0, 0, 0]]).bool()
    assert aggregate(per_token, mask, "token-mean").item() == pytest.approx(8 / 5)
    assert aggregate(per_token, mask, "seq-mean").item() == pytest.approx((1 + 4) / 2)
    with pytest.raises(ValueError, match="token-mean or seq-mean"):
        aggregate(per_token, mask, "sum")


def test_clipped_surrogate_and_corrections_by_hand():
    lp = T([[math.log(0.5), math.log(0.2)]], requires_grad=True)
    old = T([[math.log(0.4), math.log(0.2)]])
    rollout = T([[math.log(0.1), math.log(0.2)]])  # the first token: the learner is 4x likelier than rollout
    adv, mask = T([[1.0, -1.0]]), T([[1, 1]]).bool()
    # ratio = [1.25, 1]; positive advantage clipped at 1 + 0.2 -> surrogate [-1.2, 1]
    plain, _ = policy_loss(lp, old, rollout, adv, mask, LossConfig(clip_high=0.2, off_policy="none"))
    assert plain.item() == pytest.approx((-1.2 + 1.0) / 2)
    tis, stats = policy_loss(lp, old, rollout, adv, mask, LossConfig(clip_high=0.2, off_policy="tis", cap=2.0))
    assert tis.item() == pytest.approx((2.0 * -1.2 + 1.0) / 2)  # weight 4 truncated at 2
    assert stats["mismatch_kl"] == pytest.approx(k3(old, rollout).mean().item())
    mis, _ = policy_loss(lp, old, rollout, adv, mask, LossConfig(clip_high=0.2, off_policy="mis", cap=2.0))
    assert mis.item() == pytest.approx(1.0)  # the first token is masked out
    with pytest.raises(ValueError, match="none, tis or mis"):
        policy_loss(lp, old, rollout, adv, mask, LossConfig(off_policy="is"))


def test_kl_and_entropy_terms():
    lp = T([[math.log(0.5)]])
    ref = T([[math.log(0.25)]])
    cfg = LossConfig(off_policy="none", kl_coef=0.1, entropy_coef=0.01)
    loss, _ = policy_loss(lp, lp, lp, T([[0.0]]), T([[1]]).bool(), cfg, entropy=T([[2.0]]), ref_logprobs=ref)
    assert loss.item() == pytest.approx(0.1 * (0.5 - 1 - math.log(0.5)) - 0.01 * 2.0, rel=1e-5)
