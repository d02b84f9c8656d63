"""GAE credit with the value head, against hand-computed numbers, at turn and token level."""

from __future__ import annotations

import pytest
import torch

from kuberl_trainer.algorithms.gae_credit import token_level, turn_level

# positions: 0-2 prompt | 3-4 turn 0 | 5-6 observation | 7-8 turn 1 | 9 observation
TURN_INDEX = torch.tensor([[-1, -1, -1, 0, 0, -1, -1, 1, 1, -1]])
TURN_STARTS = torch.tensor([[3, 7]])
TURN_VALID = torch.tensor([[True, True]])
TURN_REWARDS = torch.tensor([[0.5, 0.0]])  # an intermediate reward after turn 0
FINAL = torch.tensor([1.0])
VALUES = torch.arange(10, dtype=torch.float32)[None] / 10  # V(tokens <= t) = t / 10


def test_turn_level_gae_by_hand():
    out = turn_level(VALUES, TURN_INDEX, TURN_STARTS, TURN_VALID, TURN_REWARDS, FINAL, gamma=0.9, lam=0.8)
    # V before turn 0 is read at position 2 (0.2), before turn 1 at 6 (0.6); rewards 0.5 then 1.0 (outcome)
    # delta1 = 1.0 - 0.6 = 0.4;  delta0 = 0.5 + 0.9 * 0.6 - 0.2 = 0.84;  A0 = 0.84 + 0.9 * 0.8 * 0.4 = 1.128
    expected = torch.tensor([[0, 0, 0, 1.128, 1.128, 0, 0, 0.4, 0.4, 0]])
    assert out.advantages == pytest.approx(expected, abs=1e-6)
    assert out.value_mask.nonzero(as_tuple=True)[1].tolist() == [2, 6]
    assert out.returns[0, 2].item() == pytest.approx(1.328) and out.returns[0, 6].item() == pytest.approx(1.0)


def test_token_level_gae_by_hand():
    out = token_level(VALUES, TURN_INDEX, TURN_VALID, TURN_REWARDS, FINAL, gamma=1.0, lam=1.0)
    # lambda = gamma = 1: A = (sum of later rewards) - V; turn 0's reward on token 4, the outcome on token 8
    expected = torch.tensor([[0, 0, 0, 1.5 - 0.2, 1.5 - 0.3, 0, 0, 1.0 - 0.6, 1.0 - 0.7, 0]])
    assert out.advantages == pytest.approx(expected, abs=1e-6)
    assert out.value_mask.nonzero(as_tuple=True)[1].tolist() == [2, 3, 6, 7]
    assert out.returns[0, [2, 3, 6, 7]] == pytest.approx(torch.tensor([1.5, 1.5, 1.0, 1.0]))


def test_token_level_td0_uses_the_next_value():
    out = token_level(VALUES, TURN_INDEX, TURN_VALID, TURN_REWARDS, FINAL, gamma=1.0, lam=0.0)
    # delta_j = r_j + V_{j+1} - V_j, with V_{j+1} the value before the next generated token
    assert out.advantages[0, 3].item() == pytest.approx(0.0 + 0.3 - 0.2)
    assert out.advantages[0, 4].item() == pytest.approx(0.5 + 0.6 - 0.3)  # across the observation
    assert out.advantages[0, 8].item() == pytest.approx(1.0 - 0.7)


def test_observation_and_padding_tokens_get_nothing():
    values = torch.cat([VALUES, torch.zeros(1, 10)])
    turn_index = torch.cat([TURN_INDEX, torch.full((1, 10), -1)])
    valid = torch.tensor([[True, True], [False, False]])
    out = turn_level(
        values,
        turn_index,
        torch.cat([TURN_STARTS, torch.zeros(1, 2, dtype=torch.long)]),
        valid,
        torch.cat([TURN_REWARDS, torch.zeros(1, 2)]),
        torch.tensor([1.0, 1.0]),
        1.0,
        1.0,
    )
    assert not out.advantages[TURN_INDEX.expand(2, -1) < 0].any() and not out.advantages[1].any()
    assert not out.value_mask[1].any()
