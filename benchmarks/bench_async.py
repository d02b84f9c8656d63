"""Async against sync training on the same machine and workload, both in one run.

Workload: swe-toy train tasks whose `run_tests` takes a heavy-tailed time (a Pareto-distributed sleep before
the tests, as agent environments do: most calls are quick, a few are very slow); the tiny model after the
job's supervised warm-up, so episodes use the tools. Each mode runs `kuberl run` for the same wall clock.
Reported: training steps per hour of RL time, and the mean batch reward of the last steps. Goal: async
>= 2.5x the steps per hour of sync at equal or better reward per step.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

RL_SECONDS = 240  # wall clock per mode, after start-up
TAIL = "python -c 'import random, time; time.sleep(min(20.0, 0.15 * random.paretovariate(1.1)))' ; "


def slow_tasks(path: Path) -> Path:
    from kuberl.suites import load_tasks
    from kuberl.suites.store import write_jsonl

    tasks = [t.model_copy(update={"test_command": TAIL + t.test_command}) for t in load_tasks("swe-toy")]
    write_jsonl(tasks, path)
    return path


def manifest(name: str, model: Path, tasks: Path, mode: str) -> dict:
    return {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"uri": str(model), "dtype": "float32", "maxContextTokens": 2048},
            "algorithm": {
                "groupSize": 4,
                "creditAssignment": {"mode": "turn", "gamma": 0.9},
                "dynamicSampling": False,
            },  # every batch the same size of work, as in the baseline
            "training": {
                "totalSteps": 10_000,
                "trajectoriesPerStep": 16,
                "learningRate": 1e-4,
                "mode": mode,
                "maxStaleness": 1 if mode == "sync" else 2,
                "seed": 3,
            },
            "environment": {"tasks": {"uri": str(tasks)}, "maxTurns": 5, "maxTokensPerTrajectory": 1536},
            "reward": {"intermediateRewards": True},
            "rollout": {
                "concurrentSessions": 48,
                "maxTokensPerTurn": 64,
                "engine": {"maxNumSeqs": 48, "maxModelLen": 2048},
            },
            "checkpoint": {"intervalSteps": 10_000},
            "limits": {"maxWallClock": f"{RL_SECONDS + 90}s", "noProgressTimeout": "10m"},
        },
    }


def summary(run_dir: Path) -> dict[str, float]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rl_seconds = lines[-1]["time"] - (lines[0]["time"] - lines[0]["step_s"])
    tail = lines[-max(1, len(lines) // 4) :]
    return {
        "steps": len(lines),
        "rl_seconds": round(rl_seconds, 1),
        "steps_per_hour": round(3600 * len(lines) / rl_seconds, 1),
        "reward_last_quarter": round(statistics.mean(x["reward_mean"] for x in tail), 4),
        "reward_first_quarter": round(statistics.mean(x["reward_mean"] for x in lines[: len(tail)]), 4),
        "mean_staleness": round(statistics.mean(x["staleness_mean"] for x in lines), 3),
        "median_wait_s": round(statistics.median(x["wait_s"] for x in lines), 2),
        # [seconds of RL, step, batch reward] per step: the report's async-against-sync plot
        "curve": [
            [round(x["time"] - lines[0]["time"] + lines[0]["step_s"], 1), x["step"], x["reward_mean"]] for x in lines
        ],
    }


def run() -> dict[str, object]:
    import yaml

    from kuberl.api.rljob import RLJob
    from kuberl.local.progress import ProgressPrinter
    from kuberl.local.runner import run_job
    from kuberl.modeling.tiny import build_tiny_model
    from kuberl_rollout.sandbox_client import SandboxEnvironments
    from kuberl_sandbox.local import local_sandbox
    from kuberl_trainer.warmup import warm_up

    out: dict[str, object] = {"rl_seconds_per_mode": RL_SECONDS}
    with tempfile.TemporaryDirectory(prefix="kuberl-async-bench-") as tmp:
        work = Path(tmp)
        tasks = slow_tasks(work / "tasks.jsonl")
        base = build_tiny_model(work / "base", hidden_size=128, layers=4, heads=4, seed=0)
        warm = manifest("warm", base, tasks, "sync")
        warm["spec"]["training"]["warmup"] = {"demonstrations": 256}
        warm_job = RLJob.from_manifest(warm)
        with local_sandbox() as sandbox:
            warm_up(warm_job, str(base), str(work / "warm"), lambda: SandboxEnvironments(sandbox.url, sandbox.token))
        for mode in ("sync", "async"):
            doc = manifest(f"bench-{mode}", work / "warm", tasks, mode)
            path = work / f"{mode}.yaml"
            path.write_text(yaml.safe_dump(doc))
            run_job(RLJob.from_manifest(doc), path, work / mode, str(work / "warm"), out=ProgressPrinter())
            out[mode] = summary(work / mode)
            print(f"[bench]   {mode}: {out[mode]}", flush=True)
        out["async_over_sync_steps_per_hour"] = round(out["async"]["steps_per_hour"] / out["sync"]["steps_per_hour"], 2)
    return out


if __name__ == "__main__":
    print(run())
