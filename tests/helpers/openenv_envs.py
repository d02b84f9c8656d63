"""OpenEnv environments that misbehave, for tests/rollout/test_openenv.py: named by class path in jobs and
played by the adapter as a user's would be."""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from kuberl.integrations.openenv_guess import GuessAction, GuessNumberEnvironment, GuessObservation


class FallsOverOnStep(GuessNumberEnvironment):
    """The guessing game, but its second guess raises."""

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        if self.state.guesses:
            raise ConnectionError("the game's backend went away")
        return super().step(action, timeout_s, **kwargs)


class FallsOverOnReset(GuessNumberEnvironment):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        raise KeyError(f"no level for seed {seed}")


class Untyped(Environment):  # type: ignore[type-arg]
    """An environment that never says what its action is."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
        return Observation()

    def step(self, action, timeout_s=None, **kwargs):  # type: ignore[no-untyped-def]
        return Observation(done=True)

    @property
    def state(self) -> State:
        return State()


class NotAnEnvironment:
    def reset(self) -> None: ...


class MoveAction(Action):
    direction: str
    steps: int = 1


class MoveObservation(Observation):
    x: int
    y: int


class GridWalk(Environment[MoveAction, MoveObservation, State]):
    """Walk a grid; the reset arguments say where to start."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MoveObservation:
        self.x, self.y = kwargs.get("x", 0), kwargs.get("y", 0)
        return MoveObservation(x=self.x, y=self.y)

    def step(self, action: MoveAction, timeout_s: float | None = None, **kwargs: Any) -> MoveObservation:
        self.x += action.steps if action.direction == "east" else -action.steps
        return MoveObservation(x=self.x, y=self.y, reward=0.5, done=self.x >= 3)

    @property
    def state(self) -> State:
        return State()
