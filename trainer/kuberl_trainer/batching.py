"""From finished trajectories to the tensors of a training step, with per-token advantages.

`collate` turns the global batch into tensors once; group-relative advantages (GRPO, RLOO, per-turn
baselines) need the whole group and are computed on the global batch; GAE needs the value head's
predictions and is computed per row on each rank's shard (`shard` then `with_gae`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import torch

from kuberl.api.spec import AlgorithmName, AlgorithmSpec, CreditAssignmentMode, GaeLevel
from kuberl.api.trajectory import Trajectory
from kuberl_trainer.algorithms import gae_credit
from kuberl_trainer.algorithms.advantages import (
    grpo,
    outcome_to_tokens,
    per_turn_baselined,
    rloo,
    to_tokens,
    turn_returns,
)
from kuberl_trainer.step import TokenBatch

# Rewards closer than this count as equal (dynamic sampling): float noise from a reward function is not signal.
UNIFORM_TOLERANCE = 1e-6


@dataclass
class Collated:
    batch: TokenBatch
    turn_index: torch.Tensor  # [B, T] the turn of each generated token, -1 elsewhere
    rewards: torch.Tensor  # [B] outcome rewards
    group_ids: torch.Tensor  # [B] index of the trajectory's group
    turn_starts: torch.Tensor  # [B, K] position of each turn's first generated token
    turn_rewards: torch.Tensor  # [B, K] intermediate (and process) rewards, 0 where none
    turn_valid: torch.Tensor  # [B, K]

    def rows(self, index: torch.Tensor) -> Collated:
        return Collated(self.batch.rows(index), *(getattr(self, f.name)[index] for f in fields(self)[1:]))


def collate(trajectories: list[Trajectory], pad_id: int) -> Collated:
    """Pad trajectories into [B, T] (tokens) and [B, K] (turns) tensors."""
    width = max(len(t.token_ids) for t in trajectories)
    turns = max(1, max(len(t.turns) for t in trajectories))
    count = len(trajectories)
    ids = torch.full((count, width), pad_id, dtype=torch.long)
    attention = torch.zeros((count, width), dtype=torch.long)
    mask = torch.zeros((count, width), dtype=torch.bool)
    logprobs = torch.zeros((count, width))
    turn_index = torch.full((count, width), -1, dtype=torch.long)
    turn_starts = torch.zeros((count, turns), dtype=torch.long)
    turn_rewards = torch.zeros((count, turns))
    turn_valid = torch.zeros((count, turns), dtype=torch.bool)
    for b, t in enumerate(trajectories):
        n = len(t.token_ids)
        ids[b, :n] = torch.tensor(t.token_ids)
        attention[b, :n] = 1
        mask[b, :n] = torch.tensor(t.loss_mask, dtype=torch.bool)
        logprobs[b, :n] = torch.tensor(t.logprobs)
        for k, turn in enumerate(t.turns):
            turn_index[b, turn.start : turn.action_end] = k
            turn_starts[b, k], turn_valid[b, k], turn_rewards[b, k] = turn.start, True, turn.reward or 0.0
    turn_index = torch.where(mask, turn_index, torch.full_like(turn_index, -1))
    groups = {g: i for i, g in enumerate(dict.fromkeys(t.group_id for t in trajectories))}
    return Collated(
        batch=TokenBatch(ids, attention, mask, logprobs, torch.zeros((count, width))),
        turn_index=turn_index,
        rewards=torch.tensor([t.final_reward for t in trajectories]),
        group_ids=torch.tensor([groups[t.group_id] for t in trajectories]),
        turn_starts=turn_starts,
        turn_rewards=turn_rewards,
        turn_valid=turn_valid,
    )


def uses_value_head(algorithm: AlgorithmSpec) -> bool:
    return algorithm.name == AlgorithmName.PPO


def filters_uniform_groups(algorithm: AlgorithmSpec) -> bool:
    """Dynamic sampling applies: the advantages are group-relative (grpo, rloo), so a group whose
    rewards are all equal has none. ppo's value-head baseline gives such a group advantages still."""
    return algorithm.dynamic_sampling and not uses_value_head(algorithm)


def has_signal(group: list[Trajectory], algorithm: AlgorithmSpec) -> bool:
    """Whether a group's group-relative advantages can be non-zero: the rewards they are computed from (the
    outcome reward; with turn or prm credit each turn's return) differ within the group by more than
    `UNIFORM_TOLERANCE`. Compared before grpo's division by the spread, which would magnify noise."""
    collated = collate(group, pad_id=0)
    group_ids = torch.zeros(len(group), dtype=torch.long)
    if algorithm.credit_assignment.mode == CreditAssignmentMode.OUTCOME:
        centred = grpo(collated.rewards.double(), group_ids, normalize_std=False)
    else:
        gamma, valid = algorithm.credit_assignment.gamma, collated.turn_valid
        returns = turn_returns(collated.turn_rewards.double(), valid, collated.rewards.double(), gamma)
        centred = torch.stack(
            [grpo(returns[:, k], group_ids, valid[:, k], normalize_std=False) for k in range(returns.shape[1])]
        )
    return bool(centred.abs().max() > UNIFORM_TOLERANCE)


def group_advantages(collated: Collated, algorithm: AlgorithmSpec) -> torch.Tensor:
    """Per-token advantages from group baselines (grpo, rloo) for outcome, turn and prm credit."""
    mode, estimator = algorithm.credit_assignment.mode, "rloo" if algorithm.name == AlgorithmName.RLOO else "grpo"
    if mode == CreditAssignmentMode.OUTCOME:
        per_trajectory = (rloo if estimator == "rloo" else grpo)(collated.rewards, collated.group_ids)
        return outcome_to_tokens(per_trajectory, collated.turn_index)
    # turn and prm: per-turn returns of the intermediate (prm: process) rewards, baselined per turn
    returns = turn_returns(
        collated.turn_rewards, collated.turn_valid, collated.rewards, algorithm.credit_assignment.gamma
    )
    return to_tokens(
        per_turn_baselined(returns, collated.turn_valid, collated.group_ids, estimator), collated.turn_index
    )


def with_gae(collated: Collated, values: torch.Tensor, algorithm: AlgorithmSpec) -> TokenBatch:
    """The batch with GAE advantages and value targets from the value head's `values` [B, T] (PPO). With
    outcome credit the steps are whole trajectories' tokens, so token-level GAE over the outcome is used."""
    credit = algorithm.credit_assignment
    gamma, lam = credit.gamma, credit.lam
    args = (values.detach().float(), collated.turn_index)
    if credit.mode == CreditAssignmentMode.GAE and credit.gae_level == GaeLevel.TURN:
        targets = gae_credit.turn_level(
            *args, collated.turn_starts, collated.turn_valid, collated.turn_rewards, collated.rewards, gamma, lam
        )
    else:
        turn_rewards = (
            collated.turn_rewards
            if credit.mode != CreditAssignmentMode.OUTCOME
            else torch.zeros_like(collated.turn_rewards)
        )
        targets = gae_credit.token_level(*args, collated.turn_valid, turn_rewards, collated.rewards, gamma, lam)
    return replace(
        collated.batch, advantages=targets.advantages, returns=targets.returns, value_mask=targets.value_mask
    )


def shard(collated: Collated, rank: int, world: int, multiple: int = 1) -> Collated:
    """This rank's rows (every world-th, from `rank`), padded with empty-mask rows so every rank has the
    same number of rows, a multiple of `multiple` (mini-batches): FSDP needs every rank in every forward."""
    count = collated.batch.input_ids.shape[0]
    per_rank = -(-count // world)
    per_rank = -(-per_rank // multiple) * multiple
    mine = torch.arange(rank, count, world)
    padding = per_rank - len(mine)
    index = torch.cat([mine, torch.zeros(padding, dtype=torch.long)])
    part = collated.rows(index)
    if padding:
        part.batch.loss_mask[len(mine) :] = False
        part.turn_index[len(mine) :] = -1
        part.turn_valid[len(mine) :] = False
    return part
