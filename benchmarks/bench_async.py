"""Sync, async, async with a bounded update drain and async with partial rollouts on the same workload, all
four in one run, with the rollout tier and the learner on cores of their own (as in a cluster, where they
never share a device).

Workload: the demo's job (examples/swe-toy.yaml: its model, warm-up and recipe), whose test runs (the
`run_tests` tool and the submission's scoring) take a log-normal time with a median of 2.5 s and a p99 of
60 s, capped at 120 s (sigma = ln(60 / 2.5) / 2.326 = 1.37): how long a real repository's test suite takes.
Command durations are heavy-tailed and close to log-normal (most runs are quick, a few take a minute); the
median and p99 are the figures the performance goals state for software-engineering test runs. File tools take no extra
time. The rollout tier (vLLM engine, rollout server, sandbox) runs on core 0, the learner on core 1 (`kuberl
run --cpus`). Each mode trains for the same wall clock after start-up.

Reported per mode: training steps per hour of RL time, the mean batch reward per step (over the steps all
modes reached) and at the fixed wall clock (the last steps done by then), the mean staleness, and the
learner's idle fraction (the time it did not train: waiting for trajectories, or for a weight update that
without partial rollouts lets the episodes in flight finish on the old weights first). Goal: async >= 2.5x
the steps per hour of sync at equal or better reward per step.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
from pathlib import Path

RL_SECONDS = 300  # wall clock per mode, after start-up
MEDIAN_S, P99_S, CAP_S = 2.5, 60.0, 120.0
SIGMA = math.log(P99_S / MEDIAN_S) / 2.326  # the 99th percentile of a standard normal
# The first line of every module the tests import: importing it for a test run (visible or hidden) takes
# that run's time. swe-toy's tests never run `test_command` (the oracle calls the module's functions), and
# the sandbox reuses the outcome of a test run of the same files (the episodes of a group testing the
# untouched files share one run), as a real test cache would.
SLOW_IMPORT = (
    "import math as _m, random as _r, time as _t; "
    f"_t.sleep(min({CAP_S}, {MEDIAN_S} * _m.exp(_r.gauss(0.0, {SIGMA:.4f}))))  # the test run's time\n"
)
# Without partial rollouts, async's weight update waits for the episodes in flight (one version per
# trajectory): `async_drain` bounds that wait at twice the median test run, then plays the episodes still
# running again on the new weights (rollout.updateDrainTimeout).
DRAIN_TIMEOUT = "5s"
MODES = {  # name: (training.mode, rollout.partialRollouts, rollout.updateDrainTimeout)
    "sync": ("sync", False, None),
    "async": ("async", False, None),
    "async_drain": ("async", False, DRAIN_TIMEOUT),
    "async_partial": ("async", True, None),
}
REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "examples" / "swe-toy.yaml"
WARM_MODEL = REPO / "runs" / "models" / "swe-toy-warm"  # the demo's warmed-up model, kept for later runs
REWARD_STEPS_AT_CLOCK = 5


def slow_tasks(path: Path, tasks: list) -> Path:
    """`tasks` whose modules under test take a test run's time to import (SLOW_IMPORT)."""
    from kuberl.suites.store import write_jsonl

    slow = []
    for task in tasks:
        checks = [*task.oracle.visible, *task.oracle.hidden] if task.oracle else []
        modules = {c.module.replace(".", "/") + ".py" for c in checks} & task.files.keys()
        if not modules:
            raise ValueError(f"task {task.task_id}: no module under test to slow down")
        files = {name: SLOW_IMPORT + text if name in modules else text for name, text in task.files.items()}
        slow.append(task.model_copy(update={"files": files}))
    write_jsonl(slow, path)
    return path


def demo_manifest() -> dict:
    import yaml

    return yaml.safe_load(DEMO.read_text())


def manifest(name: str, model: Path, tasks: Path, mode: str, partial: bool, drain_timeout: str | None) -> dict:
    doc = demo_manifest()
    spec = doc["spec"]
    doc["metadata"] = {"name": name}
    spec["model"]["uri"] = str(model)
    spec["algorithm"]["dynamicSampling"] = False  # every step the same work in every mode
    spec["training"].pop("warmup", None)
    spec["training"].update(
        {
            "totalSteps": 10_000,
            "trajectoriesPerStep": 16,
            "oversampling": 1.0,
            "mode": mode,
            "maxStaleness": 1 if mode == "sync" else 2,
        }
    )
    spec["environment"]["tasks"] = {"uri": str(tasks), "split": "train"}
    spec["environment"]["turnTimeout"] = f"{int(CAP_S) + 30}s"
    spec["environment"]["trajectoryTimeout"] = "15m"
    spec["rollout"] = {**spec.get("rollout", {}), "concurrentSessions": 48, "partialRollouts": partial}
    if drain_timeout is not None:
        spec["rollout"]["updateDrainTimeout"] = drain_timeout
    spec["rollout"].setdefault("engine", {})["maxNumSeqs"] = 48
    spec["checkpoint"] = {"intervalSteps": 10_000}
    spec["limits"] = {"maxWallClock": f"{RL_SECONDS + 120}s", "noProgressTimeout": "10m"}
    return doc


def summary(run_dir: Path, common_steps: int | None = None) -> dict[str, object]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    start = lines[0]["time"] - lines[0]["step_s"]
    done = [x for x in lines if x["time"] - start <= RL_SECONDS] or lines[:1]
    rl_seconds = done[-1]["time"] - start
    return {
        "steps": len(done),
        "rl_seconds": round(rl_seconds, 1),
        "steps_per_hour": round(3600 * len(done) / rl_seconds, 1),
        "reward_per_step": round(statistics.mean(x["reward_mean"] for x in done[:common_steps]), 4),
        "reward_at_wall_clock": round(statistics.mean(x["reward_mean"] for x in done[-REWARD_STEPS_AT_CLOCK:]), 4),
        "mean_staleness": round(statistics.mean(x["staleness_mean"] for x in done), 3),
        # not training: waiting for trajectories, or for a weight update that waits for the episodes in flight
        "learner_idle_fraction": round(1 - sum(x["train_s"] for x in done) / rl_seconds, 3),
        "median_wait_s": round(statistics.median(x["wait_s"] for x in done), 2),
        "median_weight_sync_s": round(statistics.median(x["weight_sync_s"] for x in done), 2),
        **restarts(run_dir),
        # [seconds of RL, step, batch reward] per step: the report's async-against-sync plot
        "curve": [[round(x["time"] - start, 1), x["step"], x["reward_mean"]] for x in lines],
    }


def restarts(run_dir: Path) -> dict[str, int]:
    """How many weight updates ran out of `updateDrainTimeout` over the whole run, and how many episodes they
    stopped (their work lost), from the rollout servers' logs."""
    from kuberl_rollout.service import RESTART_LOG

    counts = [
        int(line.split(RESTART_LOG, 1)[1].split()[0])
        for log in sorted((run_dir / "logs").glob("rollout-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if RESTART_LOG in line
    ]
    return {"drains_run_out": len(counts), "episodes_restarted": sum(counts)}


def warmed_up_model() -> Path:
    """The demo's base model after the demo's warm-up (built and kept under runs/models the first time)."""
    import shutil

    from kuberl.api.rljob import RLJob
    from kuberl_trainer.warmup import warm_up
    from recipes.swe_toy.cli import main as recipe

    if (WARM_MODEL / "config.json").exists():
        return WARM_MODEL
    doc = demo_manifest()
    base = REPO / doc["spec"]["model"]["uri"]
    if not (base / "copy_pretraining.json").exists():
        recipe.main(["tiny-model", str(base), "--hidden-size", "128", "--layers", "2"], standalone_mode=False)
    warmup = doc["spec"]["training"]["warmup"]
    demonstrations = REPO / warmup["demonstrations"]
    if not demonstrations.exists():
        recipe.main(["demonstrations", str(DEMO), "--out", str(demonstrations)], standalone_mode=False)
    warmup["demonstrations"] = str(demonstrations)
    partial = WARM_MODEL.with_name(WARM_MODEL.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    stats = warm_up(RLJob.from_manifest(doc), str(base), str(partial))
    print(f"[bench]   warm-up: {stats}", flush=True)
    partial.rename(WARM_MODEL)
    return WARM_MODEL


def run() -> dict[str, object]:
    import yaml

    from kuberl.api.rljob import RLJob
    from kuberl.suites import environment_tasks
    from kuberl_app.one_machine.processes import parse_pinning
    from kuberl_app.one_machine.progress import ProgressPrinter
    from kuberl_app.one_machine.runner import run_job

    cores = sorted(os.sched_getaffinity(0))
    pinning = (
        parse_pinning([f"rollout={cores[0]}", f"sandbox={cores[0]}", f"learner={cores[1]}"], set(cores))
        if len(cores) >= 2
        else None
    )
    out: dict[str, object] = {
        "rl_seconds_per_mode": RL_SECONDS,
        "update_drain_timeout": DRAIN_TIMEOUT,
        "run_tests_latency": {"distribution": "log-normal", "median_s": MEDIAN_S, "p99_s": P99_S, "cap_s": CAP_S},
        "pinning": {tier: sorted(c) for tier, c in (pinning or {}).items()} or "none: one core",
    }
    with tempfile.TemporaryDirectory(prefix="kuberl-async-bench-") as tmp:
        work = Path(tmp)
        model = warmed_up_model()
        job = RLJob.from_manifest(demo_manifest())
        tasks = slow_tasks(work / "tasks.jsonl", environment_tasks(job.spec.environment, "train"))
        for name, (mode, partial, drain_timeout) in MODES.items():
            doc = manifest(f"bench-{name.replace('_', '-')}", model, tasks, mode, partial, drain_timeout)
            path = work / f"{name}.yaml"
            path.write_text(yaml.safe_dump(doc))
            run_job(RLJob.from_manifest(doc), path, work / name, str(model), out=ProgressPrinter(), pinning=pinning)
        common = min(summary(work / name)["steps"] for name in MODES)
        for name in MODES:
            out[name] = summary(work / name, common)
            print(f"[bench]   {name}: { {k: v for k, v in out[name].items() if k != 'curve'} }", flush=True)
        sync = out["sync"]["steps_per_hour"]
        out["async_over_sync_steps_per_hour"] = round(out["async"]["steps_per_hour"] / sync, 2)
        out["async_drain_over_sync_steps_per_hour"] = round(out["async_drain"]["steps_per_hour"] / sync, 2)
        out["async_partial_over_sync_steps_per_hour"] = round(out["async_partial"]["steps_per_hour"] / sync, 2)
    return out


if __name__ == "__main__":
    print(run())
