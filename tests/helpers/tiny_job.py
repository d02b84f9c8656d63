"""The smallest RLJob spec that runs end to end on CPU (tiny model, 2-turn episodes, 4 trajectories a step),
shared by the learner and `kuberl run` end-to-end tests."""

from __future__ import annotations

from typing import Any


def tiny_job_spec(model, **sections: dict[str, Any]) -> dict[str, Any]:
    """The spec with `sections` merged in (one level deep). Dynamic sampling is off: a random tiny model
    never solves a task, so every group's rewards are equal and it would leave every group out."""
    spec = {
        "model": {"uri": str(model), "dtype": "float32", "maxContextTokens": 2048},
        "algorithm": {"groupSize": 2, "dynamicSampling": False},
        "training": {"totalSteps": 3, "trajectoriesPerStep": 4, "learningRate": 1e-3},
        "environment": {"maxTurns": 2, "maxTokensPerTrajectory": 1024, "turnTimeout": "30s", "trajectoryTimeout": "2m"},
        "rollout": {"concurrentSessions": 8, "maxTokensPerTurn": 24, "engine": {"maxNumSeqs": 16, "maxModelLen": 2048}},
        "checkpoint": {"intervalSteps": 100, "keep": 3},
    }
    for name, section in sections.items():
        spec.setdefault(name, {}).update(section)
    return spec
