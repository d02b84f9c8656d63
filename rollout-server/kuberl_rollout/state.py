"""What the rollout server's routes share: the state the app holds once the engine is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from kuberl_rollout.engine import UpdateMode
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.service import RolloutService, WorkError
from kuberl_rollout.weights import BucketAssembler


@dataclass
class RolloutState:
    """What the app holds once started (built by `kuberl_rollout.server`)."""

    service: RolloutService
    metrics: RolloutMetrics
    model_name: str
    update_mode: UpdateMode
    assembler: BucketAssembler
    context_tokens: int
    """The engine's context length (rollout.engine.maxModelLen): what a chat call without max_tokens may fill."""
    partial_rollouts: bool = False
    drain_timeout_s: float | None = None
    """rollout.updateDrainTimeout: how long an update waits for the episodes in flight (None: no limit)."""

    async def serve_weights(self, files: list[Path], version: int) -> None:
        """Swap the engine to `files` as policy `version`, episodes in flight treated as the job says."""
        engine = self.service.agent.engine
        await self.service.switch_policy(
            lambda: engine.update_weights(files, version, self.update_mode), self.partial_rollouts, self.drain_timeout_s
        )


def loaded(request: Request) -> RolloutState:
    """The app's state; 503 while the engine is still loading."""
    if request.app.state.rollout is None:
        raise WorkError(503, "the engine is still loading")
    return request.app.state.rollout


State = Annotated[RolloutState, Depends(loaded)]
"""A route parameter: the loaded state."""
