"""kuberl_sandbox_tampering_total: every reason exported at 0 from the start (so alerts and rates see 0, not
nothing), counted by `SandboxMetrics.observe_tampering`, and nothing outside the fixed set of reasons."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from kuberl.api.tampering import TamperingReason
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_trainer.learner_metrics import LearnerMetrics


def sample(metrics, name: str, **labels) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_every_reason_is_exported_at_zero_from_the_start():
    metrics = SandboxMetrics()
    for reason in TamperingReason:
        assert sample(metrics, "kuberl_sandbox_tampering_total", reason=reason.value) == 0.0
    text = generate_latest(metrics.registry).decode()
    assert text.count("kuberl_sandbox_tampering_total{") == len(TamperingReason)


def test_observe_tampering_counts_by_reason():
    metrics = SandboxMetrics()
    metrics.observe_tampering("missing_answers")
    metrics.observe_tampering(TamperingReason.MISSING_ANSWERS)
    metrics.observe_tampering("no_report")
    assert sample(metrics, "kuberl_sandbox_tampering_total", reason="missing_answers") == 2.0
    assert sample(metrics, "kuberl_sandbox_tampering_total", reason="no_report") == 1.0
    assert sample(metrics, "kuberl_sandbox_tampering_total", reason="extra_answers") == 0.0


def test_a_reason_outside_the_set_is_refused_not_a_new_series():
    metrics = SandboxMetrics()
    with pytest.raises(ValueError):
        metrics.observe_tampering("looked_odd")
    assert sample(metrics, "kuberl_sandbox_tampering_total", reason="looked_odd") is None


def test_the_learner_counter_starts_at_zero():
    assert sample(LearnerMetrics(), "kuberl_learner_tampered_trajectories_total") == 0.0
