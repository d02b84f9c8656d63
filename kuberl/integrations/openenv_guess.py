"""A number-guessing game written against OpenEnv's server interface (`openenv.core.env_server.Environment`),
as any OpenEnv environment is: the multi-turn example of examples/openenv-guess.yaml and of the adapter's tests.

The secret is drawn from the reset seed; each guess is answered `higher` or `lower` until the guess is right
(reward 1.0, done) or the guesses run out (reward 0.0, done). Small, fast and deterministic for a seed.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

LOW, HIGH = 1, 8
GUESSES = 4


class GuessAction(Action):
    """One guess."""

    number: int = Field(description=f"the guess, from {LOW} to {HIGH}")


class GuessObservation(Observation):
    """What the game says."""

    message: str = Field(description="the game's answer")


class GuessState(State):
    """The game's state: the secret and the guesses so far."""

    secret: int = 0
    guesses: list[int] = Field(default_factory=list)


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, GuessState]):
    """Guess the secret number from 1 to 8 in at most 4 guesses; each wrong guess is answered higher or lower."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = GuessState()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        secret = random.Random(seed).randint(LOW, HIGH)
        self._state = GuessState(episode_id=episode_id, secret=secret)
        return GuessObservation(message=f"I picked a number from {LOW} to {HIGH}. You have {GUESSES} guesses.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        state = self._state
        if len(state.guesses) >= GUESSES:
            raise RuntimeError("the game is over: reset it first")
        state.guesses.append(action.number)
        state.step_count += 1
        if action.number == state.secret:
            return GuessObservation(message=f"{action.number} is right!", reward=1.0, done=True)
        if len(state.guesses) == GUESSES:
            return GuessObservation(message=f"No guesses left; it was {state.secret}.", reward=0.0, done=True)
        hint = "higher" if action.number < state.secret else "lower"
        left = GUESSES - len(state.guesses)
        return GuessObservation(message=f"{action.number}: {hint}. {left} left.", reward=0.0)

    @property
    def state(self) -> GuessState:
        return self._state
