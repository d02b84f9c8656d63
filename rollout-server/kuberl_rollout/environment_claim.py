"""Claiming an episode's environment before its clock starts, one rule for every agent loop: an environment
that must first wait for a place (a sandbox session on an image's pool that scales up from zero) waits here,
outside the turn and trajectory timeouts, so an episode that never got a sandbox fails as an error (masked in
training) rather than timing out (scored 0), and one that got it late still has all of its time."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from kuberl.api.environment import Environment, Task


@runtime_checkable
class Claimable(Protocol):
    async def claim(self, task: Task) -> None:
        """Wait for and take what an episode of `task` needs (an EnvironmentFailure when it cannot)."""
        ...


async def claim_environment(env: Environment, task: Task) -> None:
    """Claim `env` for `task` when it is an environment that claims (a sandbox one); else nothing."""
    if isinstance(env, Claimable):
        await env.claim(task)
