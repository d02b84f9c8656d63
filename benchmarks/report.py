"""One report of a `make bench` run: every goal in one table, the plots, and the change against a baseline.

`benchmarks/run.py` writes `runs/bench/<time>/results.json` and then this report beside it: `report.md` (one
table: measure, goal, measured, measured ÷ goal, pass or not, baseline and change, machine, commit) and PNG
plots (rollout throughput against environments, async against sync over wall clock, recovery timeline).
The goals are the project's performance goals and the seed's; a benchmark that did not run, or a value it
could not measure, shows as such instead of passing. `benchmarks/baseline.json` is a reviewed earlier
`results.json` committed beside the code, so a change that makes a measure worse shows in the table.

Render again from a results file (after copying a new baseline, say):
    .venv/bin/python benchmarks/report.py runs/bench/<time>/results.json
"""

from __future__ import annotations

import json
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"

Results = dict[str, Any]  # benchmark name -> what its run() returned


_ABSENT = object()


def _at(results: Results, path: str) -> Any:
    """The value at a dotted path of the results, or _ABSENT where the path does not exist."""
    value: Any = results
    for key in path.split("."):
        if not isinstance(value, dict) or key not in value:
            return _ABSENT
        value = value[key]
    return value


def dig(results: Results, path: str) -> float | None:
    """The number at a dotted path of the results (`rollout.throughput.500.generated_tokens_per_s`), or None
    when a benchmark did not run or skipped that measure (it returns a sentence instead of numbers)."""
    value = _at(results, path)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def quotient(numerator: str, denominator: str) -> Callable[[Results], float | None]:
    def value(results: Results) -> float | None:
        top, bottom = dig(results, numerator), dig(results, denominator)
        return None if top is None or not bottom else top / bottom

    return value


def drain_restarts_per_update(results: Results) -> float | None:
    """bench_async's episodes restarted by drains that ran out, over the weight updates of its run (one per
    step: its curve)."""
    restarted, curve = dig(results, "async.async_drain.episodes_restarted"), _at(results, "async.async_drain.curve")
    return None if restarted is None or not curve else restarted / len(curve)


REWARD_INTERVAL_RESAMPLES = 2000


def reward_ratio_interval(mode: str) -> Callable[[Results], tuple[float, float] | None]:
    """The 95 % interval of bench_async's `mode` ÷ sync mean reward per step, by a percentile bootstrap over
    the steps all modes reached (each mode's steps resampled on their own). The batch reward of one step of
    16 episodes moves by about ±0.2, so a ratio over 6-12 steps is only known to a few tenths: the interval
    says whether a run could tell a mode's reward per step from sync's at all. Seeded: the same results give
    the same interval."""

    def interval(results: Results) -> tuple[float, float] | None:
        runs = {m: _at(results, f"async.{m}") for m in (mode, "sync")}
        if not all(isinstance(run, dict) and run.get("curve") for run in runs.values()):
            return None
        modes = [run for run in results["async"].values() if isinstance(run, dict) and "steps" in run]
        common = min((int(run["steps"]) for run in modes), default=0)
        top, bottom = ([point[2] for point in runs[m]["curve"][:common]] for m in (mode, "sync"))
        if len(top) < 2 or len(bottom) < 2:
            return None
        draw = random.Random(0)
        ratios = sorted(
            statistics.fmean(draw.choices(top, k=len(top))) / denominator
            for _ in range(REWARD_INTERVAL_RESAMPLES)
            if (denominator := statistics.fmean(draw.choices(bottom, k=len(bottom))))
        )
        if not ratios:
            return None
        return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]

    return interval


def worst_memory_estimate(results: Results) -> float | None:
    """The memory plan's largest relative error against the measured peak over all its cases."""
    cases = results.get("memory_plan", {}).get("cases") if isinstance(results.get("memory_plan"), dict) else None
    if not cases:
        return None
    return max(abs(case["ratio"] - 1) for case in cases)


@dataclass(frozen=True)
class Goal:
    measure: str
    """What is measured, in words."""
    value: Callable[[Results], float | None]
    """The measured number from a run's results (None: not measured in this run)."""
    target: float | None
    """The goal (None: reported without one)."""
    better: Literal["higher", "lower"]
    unit: str = "×"
    unreached: str | None = None
    """A dotted path whose value, when present and null, means the benchmark ran and the thing measured never
    happened in the run (full throughput never came back): reported as "not reached", not "not measured"."""
    interval: Callable[[Results], tuple[float, float] | None] | None = None
    """The measure's 95 % interval, shown beside it where the run's noise is as large as the goal's margin."""

    def passes(self, measured: float | None) -> bool | None:
        if measured is None or self.target is None:
            return None
        return measured >= self.target if self.better == "higher" else measured <= self.target


FULL_THROUGHPUT_AGAIN = "recovery.2_rollout_servers.full_throughput_again_s"

GOALS: tuple[Goal, ...] = (
    Goal(
        "async ÷ sync training steps per hour (same workload, same wall clock)",
        lambda r: dig(r, "async.async_over_sync_steps_per_hour"),
        2.5,
        "higher",
    ),
    Goal(
        "async, update drain bounded (rollout.updateDrainTimeout) ÷ sync training steps per hour",
        lambda r: dig(r, "async.async_drain_over_sync_steps_per_hour"),
        2.5,
        "higher",
    ),
    Goal(
        "async, bounded drain ÷ sync mean reward per step",
        quotient("async.async_drain.reward_per_step", "async.sync.reward_per_step"),
        1.0,
        "higher",
        interval=reward_ratio_interval("async_drain"),
    ),
    Goal(
        "async, bounded drain: episodes stopped and played again per weight update (work thrown away)",
        drain_restarts_per_update,
        None,
        "lower",
        "",
    ),
    Goal(
        "async with partial rollouts ÷ sync training steps per hour",
        lambda r: dig(r, "async.async_partial_over_sync_steps_per_hour"),
        2.5,
        "higher",
    ),
    Goal(
        "async with partial rollouts ÷ sync mean reward per step",
        quotient("async.async_partial.reward_per_step", "async.sync.reward_per_step"),
        1.0,
        "higher",
        interval=reward_ratio_interval("async_partial"),
    ),
    Goal(
        "async ÷ sync mean reward per step (the steps all modes reached)",
        quotient("async.async.reward_per_step", "async.sync.reward_per_step"),
        1.0,
        "higher",
        interval=reward_ratio_interval("async"),
    ),
    Goal(
        "learner idle fraction, async (sync's is the baseline to beat)",
        lambda r: dig(r, "async.async.learner_idle_fraction"),
        None,
        "lower",
        "",
    ),
    Goal(
        "rollout tokens/s at 500 environments ÷ vLLM offline on the same requests",
        lambda r: dig(r, "rollout.engine_vs_vllm_offline.replay.500.ratio"),
        0.9,
        "higher",
    ),
    Goal(
        "our engine path ÷ vLLM offline, the same prompts",
        lambda r: dig(r, "rollout.engine_vs_vllm_offline.ratio"),
        0.9,
        "higher",
    ),
    Goal(
        "per-environment tokens/s, 500 environments ÷ 100",
        lambda r: dig(r, "rollout.throughput.per_environment_ratio_500_vs_100"),
        0.9,
        "higher",
    ),
    Goal(
        "weight update SmolLM2-135M ÷ raw loopback HTTP copy of the same bytes",
        lambda r: dig(r, "rollout.weight_sync_smollm2_135m.ratio_to_loopback_http"),
        0.8,
        "higher",
    ),
    Goal(
        "weight update SmolLM2-135M, GB/s",
        lambda r: dig(r, "rollout.weight_sync_smollm2_135m.gb_per_s"),
        None,
        "higher",
        " GB/s",
    ),
    Goal(
        "checkpoint stall ÷ blocking save, SmolLM2-135M with AdamW",
        lambda r: dig(r, "checkpoint.smollm2_135m.stall_ratio"),
        0.05,
        "lower",
    ),
    Goal(
        "1,000 RLJobs: p99 to all children ÷ the emulator's floor",
        quotient("operator_scale.p99_s", "operator_scale.emulator_floor_s"),
        1.3,
        "lower",
    ),
    Goal(
        "memory plan: largest error against the measured peak",
        worst_memory_estimate,
        0.25,
        "lower",
        "",
    ),
    Goal(
        "sandbox: per-session commands/s, 500 sessions ÷ 100",
        lambda r: dig(r, "sandbox_sessions.per_session_throughput_500_vs_100"),
        0.9,
        "higher",
    ),
    Goal(
        "sandbox: command p99 at 500 sessions, ms",
        lambda r: dig(r, "sandbox_sessions.500.command_p99_ms"),
        100.0,
        "lower",
        " ms",
    ),
    Goal(
        "sandbox pools per image, simulated day on SWE-bench Verified's 500 images: KubeRL p99 wait for a session, s",
        lambda r: dig(r, "sandbox_pools.strategies.kuberl.wait_p99_s"),
        10.0,
        "lower",
        " s",
    ),
    Goal(
        "sandbox pools per image, simulated: KubeRL pod-hours ÷ the oracle's (pods only while episodes run)",
        lambda r: dig(r, "sandbox_pools.strategies.kuberl.pod_hours_vs_oracle"),
        1.5,
        "lower",
    ),
    Goal(
        "lost rollout server (two servers): seconds to full throughput again",
        lambda r: dig(r, FULL_THROUGHPUT_AGAIN),
        None,
        "lower",
        " s",
        unreached=FULL_THROUGHPUT_AGAIN,
    ),
    Goal(
        "SWE-bench task: episode start p50 (at base_commit, environment attached; 1,982 files; root in memory), s",
        lambda r: dig(r, "swe_tasks.episode_start.p50_s"),
        1.0,
        "lower",
        " s",
    ),
    Goal(
        "SWE-bench task: episode start p99 (root in memory), s",
        lambda r: dig(r, "swe_tasks.episode_start.p99_s"),
        None,
        "lower",
        " s",
    ),
    Goal(
        "SWE-bench task: episode start p50 with the sandbox root on disk, s",
        lambda r: dig(r, "swe_tasks.episode_start.on_disk.p50_s"),
        None,
        "lower",
        " s",
    ),
    Goal(
        "SWE-bench-format task: scoring overhead beyond the tests' own run time, s",
        lambda r: dig(r, "swe_tasks.scoring.overhead_s"),
        1.0,
        "lower",
        " s",
    ),
    Goal(
        "kuberl tasks make: instances per minute (100 in 30 minutes is 3.33)",
        lambda r: dig(r, "swe_tasks.factory.instances_per_minute"),
        3.33,
        "higher",
        "",
    ),
    Goal(
        "LoRA weight update ÷ full weights, SmolLM2-135M (rank 16, all-linear; serialise, upload, load)",
        lambda r: dig(r, "lora_weight_sync.lora_over_full.update_seconds_ratio"),
        0.05,
        "lower",
    ),
    Goal(
        "LoRA bytes per weight update ÷ full weights, SmolLM2-135M",
        lambda r: dig(r, "lora_weight_sync.lora_over_full.update_bytes_ratio"),
        None,
        "lower",
    ),
    Goal(
        "LoRA learner peak memory ÷ full fine-tuning, SmolLM2-135M, one train step",
        lambda r: dig(r, "lora_weight_sync.lora_over_full.learner_peak_memory_ratio"),
        None,
        "lower",
    ),
    Goal(
        "LoRA learner steps per hour ÷ full fine-tuning, SmolLM2-135M",
        lambda r: dig(r, "lora_weight_sync.lora_over_full.learner_steps_per_hour_ratio"),
        None,
        "higher",
    ),
    Goal(
        "LoRA learner CPU seconds per step ÷ full fine-tuning, SmolLM2-135M",
        lambda r: dig(r, "lora_weight_sync.lora_over_full.learner_cpu_seconds_per_step_ratio"),
        None,
        "lower",
    ),
)


@dataclass(frozen=True)
class Row:
    measure: str
    goal: str
    unit: str
    measured: float | None
    ratio: float | None
    """measured ÷ goal."""
    passed: bool | None
    baseline: float | None
    change: float | None
    """measured ÷ baseline − 1; positive is better for higher-is-better measures."""
    unreached: bool = False
    """The benchmark ran and recorded that what it waits for never happened (see Goal.unreached)."""
    interval: tuple[float, float] | None = None
    """The measured value's 95 % interval (see Goal.interval)."""


def _number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "not measured"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return text + unit


def rows(results: Results, baseline: Results | None = None) -> list[Row]:
    """One row per goal: the measured value against its goal and against the baseline run (pure)."""
    out = []
    for goal in GOALS:
        measured = goal.value(results)
        before = goal.value(baseline) if baseline is not None else None
        sign = "≥" if goal.better == "higher" else "≤"
        out.append(
            Row(
                measure=goal.measure,
                goal="—" if goal.target is None else f"{sign} {_number(goal.target, goal.unit)}",
                unit=goal.unit,
                measured=measured,
                ratio=None if measured is None or not goal.target else measured / goal.target,
                passed=goal.passes(measured),
                baseline=before,
                change=None if measured is None or not before else measured / before - 1,
                unreached=measured is None and goal.unreached is not None and _at(results, goal.unreached) is None,
                interval=goal.interval(results) if goal.interval is not None and measured is not None else None,
            )
        )
    return out


def machine_line(machine: dict[str, Any]) -> str:
    return f"{machine.get('cpus')} CPUs, {machine.get('memory_gib')} GiB, {machine.get('platform', '?')}"


def render_markdown(report: dict[str, Any], table: list[Row], baseline: dict[str, Any] | None, plots: list[str]) -> str:
    """report.md: the run's header, the one table, what did not run, and the plots (pure)."""
    commit = str(report.get("commit", "unknown"))[:12]
    machine = machine_line(report.get("machine", {}))
    lines = [
        f"# Benchmark report, {report.get('time', '?')}",
        "",
        f"Commit `{commit}` on {machine}. Benchmarks run: {', '.join(sorted(report.get('results', {}))) or 'none'}.",
    ]
    if baseline is not None:
        lines.append(
            f"Baseline: `{str(baseline.get('commit', '?'))[:12]}` of {baseline.get('time', '?')} on "
            f"{machine_line(baseline.get('machine', {}))} (benchmarks/baseline.json)."
        )
    lines += [
        "",
        "| measure | goal | measured | measured ÷ goal | pass | baseline | change | machine | commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdict = {True: "yes", False: "**no**", None: "—"}
    for row in table:
        shown = "not reached in the run" if row.unreached else _number(row.measured, row.unit)
        if row.interval is not None:
            shown += f" (95 % interval {_number(row.interval[0])}–{_number(row.interval[1], row.unit)})"
        lines.append(
            f"| {row.measure} | {row.goal} | {shown} | "
            f"{'—' if row.ratio is None else f'{row.ratio:.2f}'} | {verdict[row.passed]} | "
            f"{'—' if row.baseline is None else _number(row.baseline, row.unit)} | "
            f"{'—' if row.change is None else f'{row.change:+.0%}'} | {machine} | `{commit}` |"
        )
    measured = [r for r in table if r.passed is not None]
    lines += [
        "",
        f"{sum(bool(r.passed) for r in measured)} of {len(measured)} goals measured in this run are met; "
        f"{sum(r.measured is None and not r.unreached for r in table)} measures were not measured (their benchmark "
        "did not run or skipped them).",
    ]
    for name, error in sorted(report.get("failed", {}).items()):
        lines.append(f"\n**{name} failed**: `{error.splitlines()[0] if error else '?'}` (results.json has the rest)")
    if plots:
        lines += ["", *[f"![{Path(p).stem}]({p})" for p in plots]]
    return "\n".join(lines) + "\n"


def plot_throughput(results: Results, out: Path) -> Path | None:
    """Generated tokens/s (all environments) and per environment against the number of environments."""
    throughput = results.get("rollout", {}).get("throughput") if isinstance(results.get("rollout"), dict) else None
    levels = sorted(int(k) for k in (throughput or {}) if k.isdigit())
    if not levels:
        return None
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(6, 4))
    ax.plot(levels, [throughput[str(n)]["generated_tokens_per_s"] for n in levels], "o-", label="all environments")
    offline = dig(results, "rollout.engine_vs_vllm_offline.offline_tokens_per_s")
    if offline is not None:
        ax.axhline(offline, linestyle="--", color="gray", label=f"vLLM offline: {offline:.0f}")
    ax.set_xlabel("concurrent environments")
    ax.set_ylabel("generated tokens/s")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("rollout throughput against environments")
    return _save(plt, figure, out)


def plot_async_against_sync(results: Results, out: Path) -> Path | None:
    """Batch reward against seconds of RL, one line per mode, a marker per step."""
    modes = {m: v["curve"] for m, v in (results.get("async") or {}).items() if isinstance(v, dict) and "curve" in v}
    if not modes:
        return None
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7, 4))
    for mode, curve in modes.items():
        ax.plot([p[0] for p in curve], [p[2] for p in curve], ".-", label=f"{mode}: {len(curve)} steps")
    ax.set_xlabel("seconds of RL")
    ax.set_ylabel("batch reward")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    ax.set_title("async against sync over wall clock")
    return _save(plt, figure, out)


def plot_recovery(results: Results, out: Path) -> Path | None:
    """Step seconds and learner wait around the kill of a rollout server, one line per configuration."""
    runs = {
        k: v["timeline"] for k, v in (results.get("recovery") or {}).items() if isinstance(v, dict) and "timeline" in v
    }
    if not runs:
        return None
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(7, 4))
    for (name, timeline), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green"), strict=False):
        steps = timeline["steps"]
        ax.plot([s[0] for s in steps], [s[1] for s in steps], "o-", color=color, label=f"{name}: step seconds")
        ax.plot([s[0] for s in steps], [s[2] for s in steps], "x:", color=color, label=f"{name}: learner wait")
        ax.axvline(timeline["ready_s"], color=color, alpha=0.4, label=f"{name}: replacement serving")
    ax.axvline(0, color="red", label="rollout server killed")
    ax.set_xlabel("seconds from the kill")
    ax.set_ylabel("seconds")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax.set_title("recovery from a lost rollout server")
    return _save(plt, figure, out)


PLOTS: tuple[tuple[str, Callable[[Results, Path], Path | None]], ...] = (
    ("throughput.png", plot_throughput),
    ("async_vs_sync.png", plot_async_against_sync),
    ("recovery.png", plot_recovery),
)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, figure, out: Path) -> Path:
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out


def load_baseline(path: Path = BASELINE) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def write_report(report: dict[str, Any], folder: Path, baseline: dict[str, Any] | None = None) -> Path:
    """Write report.md and the plots into `folder` (beside results.json); return report.md's path."""
    results = report.get("results", {})
    plots = [made.name for name, plot in PLOTS if (made := plot(results, folder / name)) is not None]
    table = rows(results, baseline.get("results") if baseline else None)
    out = folder / "report.md"
    out.write_text(render_markdown(report, table, baseline, plots))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: report.py runs/bench/<time>/results.json", file=sys.stderr)
        return 2
    path = Path(argv[0])
    try:
        report = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        print(f"{path}: cannot read a benchmark result ({error}); give the results.json that make bench wrote")
        return 2
    print(f"wrote {write_report(report, path.parent, load_baseline())}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
