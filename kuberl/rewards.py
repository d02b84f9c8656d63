"""Reward functions: plain callables registered by name, or given as `module:function` in the RLJob.

    from kuberl.rewards import reward

    @reward("my-reward")
    def my_reward(ctx):            # ctx: kuberl.api.environment.RewardContext
        if not ctx.final:
            return None            # no intermediate reward
        return 1.0 if "DONE" in ctx.last_result.observation else 0.0

See docs/rewards.md. Rewards are computed where the episode runs (the rollout tier), from what the
environment returned; user code never has to be installed in sandbox images.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from kuberl.api.environment import RewardContext, RewardFunction

_REGISTRY: dict[str, RewardFunction] = {}


def reward(name: str) -> Callable[[RewardFunction], RewardFunction]:
    """Register a reward function under `name` (decorator)."""

    def register(fn: RewardFunction) -> RewardFunction:
        if name in _REGISTRY and _REGISTRY[name] is not fn:
            raise ValueError(f"reward {name!r} is already registered by {_REGISTRY[name]!r}")
        _REGISTRY[name] = fn
        return fn

    return register


def registered_rewards() -> list[str]:
    return sorted(_REGISTRY)


def resolve_reward(ref: str) -> RewardFunction:
    """The reward function named by `ref`: a registered name or `module:function`."""
    if ref in _REGISTRY:
        return _REGISTRY[ref]
    if ":" not in ref:
        raise ValueError(
            f"unknown reward {ref!r}: registered rewards are {', '.join(registered_rewards())}; or give module:function"
        )
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"reward {ref!r}: cannot import module {module_name!r} ({err})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward {ref!r}: module {module_name!r} has no callable {attr!r}")
    return fn


def _test_fraction(info: dict, key: str) -> float | None:
    tests = info.get(key)
    return float(tests["fraction"]) if isinstance(tests, dict) and "fraction" in tests else None


@reward("swe-toy-tests")
def swe_toy_tests_reward(ctx: RewardContext) -> float | None:
    """Outcome: the fraction of hidden tests passing at submit (0 when the agent never submitted).

    Intermediate (after each visible test run but the first): the change in the fraction of visible
    tests passing since the previous run. The shaping telescopes, so it rewards the edit that fixed
    a test without changing which policy is best.
    """
    last = ctx.last_result
    if ctx.final:
        fraction = _test_fraction(last.info, "hiddenTests") if last else None
        return fraction or 0.0
    if last is None or (now := _test_fraction(last.info, "tests")) is None:
        return None
    earlier = [f for r in ctx.results[:-1] if (f := _test_fraction(r.info, "tests")) is not None]
    return now - earlier[-1] if earlier else None
