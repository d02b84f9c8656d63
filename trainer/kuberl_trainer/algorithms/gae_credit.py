"""GAE credit with PPO's value head, at turn or token level, placed on the token grid.

Values come from the model on the whole sequence: `values[b, t]` is V(tokens <= t). The state before a
step whose first generated token sits at position p is read at p - 1. A step is a turn (turn level) or
one generated token (token level); a turn's reward arrives at its last step, the outcome at the last
step of the episode. Observation tokens are never steps, so they get neither advantage nor value loss.
Pure functions on tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kuberl_trainer.algorithms.advantages import gae


@dataclass
class GaeTargets:
    advantages: torch.Tensor  # [B, T] on generated tokens, 0 elsewhere
    returns: torch.Tensor  # [B, T] value targets at the positions in value_mask
    value_mask: torch.Tensor  # [B, T] bool: where V is read (and trained)


def step_rewards(turn_rewards: torch.Tensor, turn_valid: torch.Tensor, final_reward: torch.Tensor) -> torch.Tensor:
    """Per-turn rewards [B, K] with the outcome added to each trajectory's last valid turn."""
    rewards = torch.where(turn_valid, turn_rewards, torch.zeros_like(turn_rewards)).clone()
    last = turn_valid.sum(dim=1) - 1
    has = last >= 0
    rewards[torch.arange(len(rewards))[has], last[has]] += final_reward[has]
    return rewards


def turn_level(
    values: torch.Tensor,
    turn_index: torch.Tensor,
    turn_starts: torch.Tensor,
    turn_valid: torch.Tensor,
    turn_rewards: torch.Tensor,
    final_reward: torch.Tensor,
    gamma: float,
    lam: float,
) -> GaeTargets:
    """One step per turn: V read before the turn's first generated token; the advantage spread over the
    turn's generated tokens."""
    positions = (turn_starts - 1).clamp(min=0)
    step_values = torch.where(turn_valid, values.gather(1, positions), torch.zeros_like(turn_rewards))
    advantages = gae(step_rewards(turn_rewards, turn_valid, final_reward), step_values, turn_valid, gamma, lam)
    returns = torch.zeros_like(values)
    value_mask = torch.zeros_like(values, dtype=torch.bool)
    rows, cols = turn_valid.nonzero(as_tuple=True)
    returns[rows, positions[rows, cols]] = (advantages + step_values)[rows, cols]
    value_mask[rows, positions[rows, cols]] = True
    spread = advantages.gather(1, turn_index.clamp(min=0))
    return GaeTargets(torch.where(turn_index >= 0, spread, torch.zeros_like(spread)), returns, value_mask)


def token_level(
    values: torch.Tensor,
    turn_index: torch.Tensor,
    turn_valid: torch.Tensor,
    turn_rewards: torch.Tensor,
    final_reward: torch.Tensor,
    gamma: float,
    lam: float,
) -> GaeTargets:
    """One step per generated token: V read before each generated token; a turn's reward on its last
    generated token, the outcome on the episode's last."""
    generated = turn_index >= 0
    count = int(generated.sum(dim=1).max()) if generated.any() else 0
    batch = values.shape[0]
    step_pos = torch.zeros((batch, count), dtype=torch.long)
    step_valid = torch.zeros((batch, count), dtype=torch.bool)
    step_reward = torch.zeros((batch, count), dtype=values.dtype)
    per_turn = step_rewards(turn_rewards, turn_valid, final_reward)
    for b in range(batch):
        pos = generated[b].nonzero(as_tuple=True)[0]
        step_pos[b, : len(pos)], step_valid[b, : len(pos)] = pos, True
        turns = turn_index[b, pos]
        # the last generated token of each turn: where the next token belongs to another turn (or none)
        last_of_turn = torch.ones(len(pos), dtype=torch.bool)
        last_of_turn[:-1] = turns[1:] != turns[:-1]
        step_reward[b, : len(pos)] = torch.where(last_of_turn, per_turn[b, turns], torch.zeros(len(pos)))
    positions = (step_pos - 1).clamp(min=0)
    step_values = torch.where(step_valid, values.gather(1, positions), torch.zeros_like(step_reward))
    advantages = gae(step_reward, step_values, step_valid, gamma, lam)
    out_adv = torch.zeros_like(values)
    returns = torch.zeros_like(values)
    value_mask = torch.zeros_like(values, dtype=torch.bool)
    rows, cols = step_valid.nonzero(as_tuple=True)
    out_adv[rows, step_pos[rows, cols]] = advantages[rows, cols]
    returns[rows, positions[rows, cols]] = (advantages + step_values)[rows, cols]
    value_mask[rows, positions[rows, cols]] = True
    return GaeTargets(out_adv, returns, value_mask)
