"""From finished trajectories to the tensors of a training step, with per-token advantages."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kuberl.api.spec import AlgorithmName, AlgorithmSpec, CreditAssignmentMode
from kuberl.api.trajectory import Trajectory
from kuberl_trainer.algorithms.advantages import (
    grpo,
    outcome_to_tokens,
    per_turn_baselined,
    rloo,
    to_tokens,
    turn_returns,
)
from kuberl_trainer.step import TokenBatch


@dataclass
class Collated:
    batch: TokenBatch
    turn_index: torch.Tensor
    rewards: torch.Tensor


def collate(trajectories: list[Trajectory], pad_id: int) -> Collated:
    """Pad trajectories into [B, T] tensors; turn_index marks which turn each generated token belongs to."""
    width = max(len(t.token_ids) for t in trajectories)
    count = len(trajectories)
    ids = torch.full((count, width), pad_id, dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.bool)
    logprobs = torch.zeros((count, width))
    turn_index = torch.full((count, width), -1, dtype=torch.long)
    for b, t in enumerate(trajectories):
        n = len(t.token_ids)
        ids[b, :n] = torch.tensor(t.token_ids)
        attention[b, :n] = 1
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.bool)
        logprobs[b, :n] = torch.tensor(t.logprobs)
        for k, turn in enumerate(t.turns):
            turn_index[b, turn.start : turn.action_end] = k
    turn_index = torch.where(mask, turn_index, torch.full_like(turn_index, -1))
    rewards = torch.tensor([t.final_reward for t in trajectories])
    return Collated(TokenBatch(ids, attention, mask, logprobs, torch.zeros((count, width))), turn_index, rewards)


def token_advantages(trajectories: list[Trajectory], collated: Collated, algorithm: AlgorithmSpec) -> torch.Tensor:
    """Per-token advantages for the algorithm and credit-assignment mode of the job (ppo/gae need the value
    head, which the learner does not have yet)."""
    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    group_ids = torch.tensor([groups[t.group_id] for t in trajectories])
    mode = algorithm.credit_assignment.mode
    if algorithm.name == AlgorithmName.PPO or mode == CreditAssignmentMode.GAE:
        raise NotImplementedError("ppo / gae credit needs the value head, which is not implemented yet")
    if mode == CreditAssignmentMode.OUTCOME:
        per_trajectory = rloo(collated.rewards, group_ids) if algorithm.name == AlgorithmName.RLOO else grpo(
            collated.rewards, group_ids)  # fmt: skip
        return outcome_to_tokens(per_trajectory, collated.turn_index)
    turns = max(1, max(len(t.turns) for t in trajectories))
    turn_rewards = torch.zeros((len(trajectories), turns))
    valid = torch.zeros((len(trajectories), turns), dtype=torch.bool)
    for b, t in enumerate(trajectories):
        for k, turn in enumerate(t.turns):
            valid[b, k] = True
            turn_rewards[b, k] = turn.reward or 0.0
    returns = turn_returns(turn_rewards, valid, collated.rewards, algorithm.credit_assignment.gamma)
    estimator = "rloo" if algorithm.name == AlgorithmName.RLOO else "grpo"
    return to_tokens(per_turn_baselined(returns, valid, group_ids, estimator), collated.turn_index)
