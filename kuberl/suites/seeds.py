"""The reset-seed suite of an environment that makes its own episodes (an OpenEnv environment,
`spec.environment.name: openenv:module:Class`): task `seed-i` resets the environment with seed i. Every fourth
task is held out, so task i is the same whatever the count."""

from __future__ import annotations

from kuberl.api.environment import Task
from kuberl.api.spec import TaskSplit

DEFAULT_COUNT = 64
HELD_OUT_EVERY = 4


def generate(count: int = DEFAULT_COUNT) -> list[Task]:
    """The first `count` seed tasks; the environment renders the prompt when it resets."""
    if count < 0:
        raise ValueError(f"count must be >= 0, got {count}")
    return [
        Task(
            task_id=f"seed-{i}",
            split=TaskSplit.TEST if i % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else TaskSplit.TRAIN,
            prompt=f"An episode of the environment reset with seed {i}.",
            metadata={"seed": i},
        )
        for i in range(count)
    ]
