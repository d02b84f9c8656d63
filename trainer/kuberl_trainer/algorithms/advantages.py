"""Advantages: how a group of trajectories' rewards become per-turn and per-token credit.

Pure functions on tensors, no model. Shapes: B trajectories, K turns (padded), T tokens (padded).
`turn_index[b, t]` is the turn a generated token belongs to, -1 for prompt and observation tokens, so
observation tokens never receive an advantage (and so never gradient).
"""

from __future__ import annotations

import torch

EPS = 1e-6


def _group_stats(values: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per element: the sum and count of valid values in its group (for leave-one-out and means)."""
    groups = torch.unique(group_ids)
    onehot = (group_ids[None, :] == groups[:, None]).to(values.dtype)  # [G, B]
    v = torch.where(valid, values, torch.zeros_like(values))
    sums = torch.einsum("gb,b...->g...", onehot, v)
    counts = torch.einsum("gb,b...->g...", onehot, valid.to(values.dtype))
    squares = torch.einsum("gb,b...->g...", onehot, v * v)
    index = (group_ids[:, None] == groups[None, :]).to(values.dtype).argmax(dim=1)
    return sums[index], counts[index], squares[index]


def grpo(
    rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor | None = None, normalize_std: bool = True
) -> torch.Tensor:
    """(r - mean of the group) / (std of the group): GRPO's group-normalised advantage, elementwise."""
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    sums, counts, squares = _group_stats(rewards, group_ids, valid)
    mean = sums / counts.clamp(min=1)
    advantage = rewards - mean
    if normalize_std:
        var = (squares / counts.clamp(min=1) - mean**2).clamp(min=0)
        advantage = advantage / (var.sqrt() + EPS)
    return torch.where(valid, advantage, torch.zeros_like(advantage))


def rloo(rewards: torch.Tensor, group_ids: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """r - mean of the *other* members of the group (leave-one-out baseline), elementwise."""
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    sums, counts, _ = _group_stats(rewards, group_ids, valid)
    others = (sums - torch.where(valid, rewards, torch.zeros_like(rewards))) / (counts - 1).clamp(min=1)
    return torch.where(valid & (counts > 1), rewards - others, torch.zeros_like(rewards))


def turn_returns(
    turn_rewards: torch.Tensor, turn_valid: torch.Tensor, final_reward: torch.Tensor, gamma: float
) -> torch.Tensor:
    """G[b, k] = sum over j >= k of gamma^(j-k) r[b, j], the final reward counted at the last turn."""
    rewards = torch.where(turn_valid, turn_rewards, torch.zeros_like(turn_rewards)).clone()
    last = turn_valid.sum(dim=1) - 1
    rows = torch.arange(rewards.shape[0])
    rewards[rows[last >= 0], last[last >= 0]] += final_reward[last >= 0]
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(final_reward)
    for k in reversed(range(rewards.shape[1])):
        running = rewards[:, k] + gamma * running * turn_valid[:, k]
        returns[:, k] = running
    return torch.where(turn_valid, returns, torch.zeros_like(returns))


def per_turn_baselined(
    returns: torch.Tensor, turn_valid: torch.Tensor, group_ids: torch.Tensor, estimator: str = "grpo"
) -> torch.Tensor:
    """Advantage of each turn against the same turn of the other trajectories of its group."""
    return _per_turn(returns, turn_valid, group_ids, rloo_mode=estimator == "rloo")


def _per_turn(
    returns: torch.Tensor, turn_valid: torch.Tensor, group_ids: torch.Tensor, rloo_mode: bool
) -> torch.Tensor:
    out = torch.zeros_like(returns)
    for k in range(returns.shape[1]):
        column, valid = returns[:, k], turn_valid[:, k]
        out[:, k] = rloo(column, group_ids, valid) if rloo_mode else grpo(column, group_ids, valid)
    return out


def gae(rewards: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    """Generalised advantage estimation over steps (tokens or turns): A = sum (gamma lam)^l delta_{t+l}.

    `values[b, s]` is V(state before step s); the value after the last valid step is 0 (episodic).
    """
    advantages = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    next_value = torch.zeros_like(running)
    for s in reversed(range(rewards.shape[1])):
        delta = rewards[:, s] + gamma * next_value - values[:, s]
        running = torch.where(valid[:, s], delta + gamma * lam * running, torch.zeros_like(running))
        advantages[:, s] = running
        next_value = torch.where(valid[:, s], values[:, s], torch.zeros_like(next_value))
    return advantages


def to_tokens(per_turn: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Spread per-turn advantages [B, K] onto tokens [B, T]; tokens with turn_index -1 get 0."""
    gathered = per_turn.gather(1, turn_index.clamp(min=0))
    return torch.where(turn_index >= 0, gathered, torch.zeros_like(gathered))


def outcome_to_tokens(per_trajectory: torch.Tensor, turn_index: torch.Tensor) -> torch.Tensor:
    """Every generated token gets its trajectory's advantage."""
    return torch.where(
        turn_index >= 0,
        per_trajectory[:, None].expand_as(turn_index).to(per_trajectory.dtype),
        torch.zeros(turn_index.shape, dtype=per_trajectory.dtype),
    )
