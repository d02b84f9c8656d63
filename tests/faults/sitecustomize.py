"""Fault injection for end-to-end tests, from outside the product (no switch in the learner's loop).

A test puts this folder on PYTHONPATH for `kuberl run`; every Python process it starts then imports this
file first. With `KUBERL_TEST_NAN_FROM_STEP=N` set, the learner's `train_step` sees NaN advantages from its
N-th call on, so the NonFiniteLoss breaker can be tested end to end. Without it, nothing happens.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

NAN_FROM_STEP = os.environ.get("KUBERL_TEST_NAN_FROM_STEP")


class _PatchTrainStep(importlib.abc.MetaPathFinder):
    """Wraps `kuberl_trainer.step.train_step` as the module is loaded, before the learner imports the name."""

    def find_spec(self, name, path=None, target=None):
        if name != "kuberl_trainer.step":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def exec_module(module):
            load(module)
            _poison(module, int(NAN_FROM_STEP))

        spec.loader.exec_module = exec_module
        return spec


def _poison(module, first: int) -> None:
    import torch

    original, calls = module.train_step, [0]

    def train_step(model, optimizer, tokens, *args, **kwargs):
        calls[0] += 1
        if calls[0] >= first:
            tokens.advantages = torch.full_like(tokens.advantages, float("nan"))
        return original(model, optimizer, tokens, *args, **kwargs)

    module.train_step = train_step


if NAN_FROM_STEP:
    sys.meta_path.insert(0, _PatchTrainStep())
