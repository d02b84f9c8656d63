"""The sandbox-pools benchmark's simulation (benchmarks/bench_sandbox_pools.py) on a short trace: the caps hold,
every episode is served, and no strategy beats the oracle's pod-hours."""

from __future__ import annotations

import dataclasses
import functools
import sys

import numpy as np
import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_sandbox_pools as bench  # benchmarks/ is a folder of scripts, not a package

# one hour on 50 images (Verified's mix, scaled down), with caps tight enough to bind
SHORT = bench.Setup(
    hours=1.0,
    repositories={"django": 23, "sympy": 8, "sphinx-doc": 5, "matplotlib": 4, "scikit-learn": 4, "astropy": 6},
    max_replicas=14,
    max_warm_images=12,
    idle_timeout_s=120.0,
)


@functools.cache
def outcomes(setup: bench.Setup = SHORT) -> tuple[bench.Trace, dict[str, bench.Outcome]]:
    trace = bench.make_trace(setup)
    return trace, {name: strategy(trace, setup) for name, strategy in bench.STRATEGIES.items()}


def test_the_trace_draws_every_task_once_per_epoch():
    trace, _ = outcomes()
    groups = trace.image[:: SHORT.group_size]  # one task per group
    epoch = groups[:50]
    assert len(groups) >= 50 and sorted(epoch) == list(range(50))


def test_the_next_step_is_announced_when_the_batch_is_collected_and_submitted_a_training_step_later():
    trace, _ = outcomes()
    ends = trace.submit_s + trace.duration_s
    collected = np.array([ends[trace.step == k].max() for k in range(trace.step_submit_s.size - 1)])
    assert np.allclose(trace.step_announce_s[1:], collected)
    assert np.allclose(trace.step_submit_s[1:] - trace.step_announce_s[1:], SHORT.train_s)
    assert trace.step_announce_s[0] == trace.step_submit_s[0]  # no batch before the first step


def test_the_next_step_is_announced_once_a_fraction_of_the_episodes_has_finished():
    setup = dataclasses.replace(SHORT, announce_fraction=0.5)
    trace = bench.make_trace(setup)
    ends = trace.submit_s + trace.duration_s
    for k in range(trace.step_submit_s.size - 1):
        step = ends[trace.step == k]
        finished = np.sum(step <= trace.step_announce_s[k + 1])
        assert finished == step.size // 2  # the 64th of 128 ended: half, not one more, not one fewer
        assert trace.step_submit_s[k] < trace.step_announce_s[k + 1] < step.max()


def test_the_first_step_may_be_announced_before_it_is_submitted_and_is_then_warm():
    uncapped = dataclasses.replace(SHORT, max_replicas=64, max_warm_images=64)  # the first step's 16 images
    ahead = dataclasses.replace(uncapped, first_lead_s=600.0)
    trace = bench.make_trace(ahead)
    assert trace.step_announce_s[0] == trace.step_submit_s[0] - 600.0
    warm = bench.kuberl(trace, ahead).waits[trace.step == 0]
    unannounced = bench.make_trace(uncapped)  # the same episodes, the first step announced as it is submitted
    assert np.array_equal(unannounced.duration_s, trace.duration_s)
    cold = bench.kuberl(unannounced, uncapped).waits[trace.step == 0]
    assert warm.max() == 0.0 < cold.min()  # pulled in time, nothing waits; else every episode waits for a pull


def test_the_announcement_sensitivities():
    ahead = bench.make_trace(dataclasses.replace(SHORT, announce="step-ahead"))
    assert np.array_equal(ahead.step_announce_s[1:], ahead.step_submit_s[:-1])
    none = bench.make_trace(dataclasses.replace(SHORT, announce="none", first_lead_s=60.0))
    assert np.array_equal(none.step_announce_s, none.step_submit_s)
    with pytest.raises(ValueError):
        bench.make_trace(dataclasses.replace(SHORT, announce="sometimes"))
    with pytest.raises(ValueError):
        bench.make_trace(dataclasses.replace(SHORT, announce_fraction=0.0))


def test_the_caps_are_never_exceeded():
    _, result = outcomes()
    assert 0 < result["kuberl"].max_pods <= SHORT.max_replicas
    assert 0 < result["kuberl"].max_images <= SHORT.max_warm_images
    assert result["kuberl"].capped_pod_ticks > 0  # the caps did bind on this trace


@pytest.mark.parametrize("strategy", list(bench.STRATEGIES))
def test_every_episode_is_served(strategy):
    trace, result = outcomes()
    outcome = result[strategy]
    assert outcome.waits.shape == trace.image.shape and np.all(np.isfinite(outcome.waits))
    assert np.all(outcome.waits >= 0)
    assert outcome.end_s >= float(np.max(trace.submit_s + trace.duration_s))


def test_no_strategy_uses_fewer_pod_hours_than_the_oracle():
    _, result = outcomes()
    best = result["oracle"].pod_seconds
    assert best > 0 and all(outcome.pod_seconds >= best for outcome in result.values())


def test_warm_pools_wait_less_than_a_pod_per_episode():
    _, result = outcomes()
    assert np.median(result["kuberl"].waits) < np.median(result["pod-per-episode"].waits)


def test_the_report_has_every_strategy_and_the_goal():
    variants = {"kuberl, idleTimeout 0s": {"idle_timeout_s": 0.0}, "kuberl, training 600 s": {"train_s": 600.0}}
    report = bench.run(SHORT, variants=variants)
    assert set(report["strategies"]) == {*bench.STRATEGIES, *variants}
    assert report["strategies"]["oracle"]["pod_hours_vs_oracle"] == 1.0
    assert isinstance(report["goal_met"], bool)
    # a longer training step is a shorter trace in the same hours, compared with its own oracle
    longer = report["strategies"]["kuberl, training 600 s"]
    assert longer["episodes"] < report["episodes"] and longer["pod_hours_vs_oracle"] >= 1.0
