"""The learning-rate warm-up (spec.training.lrWarmupSteps): a linear rise from the step count alone, so a
resumed learner continues the schedule where the stopped one was."""

from __future__ import annotations

import pytest

from kuberl.api.spec import TrainingSpec
from kuberl_trainer.learner_loop import learning_rate_at


def test_the_rate_rises_linearly_then_stays_at_the_learning_rate():
    training = TrainingSpec(learning_rate=1e-3, lr_warmup_steps=4)
    rates = [learning_rate_at(step, training) for step in range(6)]
    assert rates == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])


def test_without_a_warm_up_every_step_trains_at_the_learning_rate():
    training = TrainingSpec(learning_rate=3e-4)
    assert [learning_rate_at(step, training) for step in (0, 1, 100)] == [3e-4] * 3


def test_a_negative_warm_up_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"lrWarmupSteps|lr_warmup_steps"):
        TrainingSpec.model_validate({"learningRate": 1e-3, "lrWarmupSteps": -1})
