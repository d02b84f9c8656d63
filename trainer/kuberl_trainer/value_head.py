"""The value head of PPO: a linear map from the policy's last hidden state to a scalar value.

It shares the policy's trunk (no second model in memory) and lives on the policy module as
`value_head`, so FSDP shards it and checkpoints carry it; exports for serving leave it out.
"""

from __future__ import annotations

import torch

VALUE_HEAD = "value_head"


def attach_value_head(model) -> None:
    """Give `model` a zero-initialised value head (V = 0 at first: GAE starts from plain returns)."""
    head = torch.nn.Linear(model.config.hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    setattr(model, VALUE_HEAD, head)


def has_value_head(model) -> bool:
    return isinstance(getattr(model, VALUE_HEAD, None), torch.nn.Module)


def is_value_head_weight(name: str) -> bool:
    """True for state-dict names of the value head (not part of the served policy)."""
    return name.split(".", 1)[0] == VALUE_HEAD
