"""The LoRA weight-sync benchmark's pure parts (benchmarks/bench_lora_weight_sync.py): the LoRA ÷ full ratios the
report's goals read, and the goal on the adapter update."""

from __future__ import annotations

import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_lora_weight_sync as bench  # benchmarks/ is a folder of scripts, not a package
from report import GOALS


def test_the_summary_divides_each_lora_measure_by_the_full_weights_one():
    updates = {"full": {"seconds": 10.0, "bytes": 1000}, "lora": {"seconds": 0.2, "bytes": 40}}
    learner = {
        "full": {"peak_mib": 5000.0, "steps_per_hour": 200.0},
        "lora": {"peak_mib": 4000.0, "steps_per_hour": 300.0},
    }
    assert bench.summary(updates, learner) == {
        "update_seconds_ratio": 0.02,
        "update_bytes_ratio": 0.04,
        "learner_peak_memory_ratio": 0.8,
        "learner_steps_per_hour_ratio": 1.5,
        "learner_cpu_seconds_per_step_ratio": 0.0,  # not measured
    }
    assert bench.ratio(1.0, 0.0) == 0.0  # nothing measured to compare with


def test_the_report_holds_the_adapter_update_to_a_twentieth_of_the_full_one():
    goal = next(g for g in GOALS if g.measure.startswith("LoRA weight update"))
    results = {"lora_weight_sync": {"lora_over_full": {"update_seconds_ratio": 0.01}}}
    assert goal.value(results) == 0.01 and goal.passes(0.01) and not goal.passes(0.06)
    assert bench.lora_spec().rank == bench.RANK and bench.lora_spec().target_modules == ["all-linear"]
