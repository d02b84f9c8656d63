"""Record `make demo-lora` runs as data: a pretrained model (SmolLM2-135M-Instruct) learning swe-toy with LoRA, and
the same recipe with full fine-tuning side by side.

    .venv/bin/python benchmarks/lora_learning.py side-by-side --warmup runs/swe-toy-smollm2-lora/warmup --steps 5
    .venv/bin/python benchmarks/lora_learning.py record --lora runs/swe-toy-smollm2-lora \
        --side-by-side runs/lora-side-by-side

`side-by-side` runs the example's RL from the same warmed-up model for the same number of steps, with LoRA and with
full fine-tuning (a tenth of the learning rate), one after the other on the whole machine. `record` reads the run
folders (job.json: held-out solve rates and the stop; warmup/warmup.json; metrics.jsonl: reward and time per RL
step) and writes benchmarks/measured/lora_smollm2_learning.json and docs/img/lora-smollm2-learning.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import commit, machine  # benchmarks/run.py: the machine and the commit every result carries

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "swe-toy-smollm2-lora.yaml"
KUBERL = Path(sys.executable).parent / "kuberl"
OUT = REPO / "benchmarks" / "measured" / "lora_smollm2_learning.json"
PLOT = REPO / "docs" / "img" / "lora-smollm2-learning.png"
TIME_PARTS = ("wait_s", "train_s", "weight_sync_s", "checkpoint_s")


def steps(run_dir: Path) -> list[dict]:
    """The learner's RL steps (metrics.jsonl lines with a reward), in order."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [line for line in lines if "reward_mean" in line and "step" in line]


def summary(run_dir: Path) -> dict:
    """One run: held-out solve rates, the warm-up, RL steps and where a step's seconds go."""
    record = json.loads((run_dir / "job.json").read_text())
    warmup_file = run_dir / "warmup" / "warmup.json"
    warmup = json.loads(warmup_file.read_text()) if warmup_file.exists() else {}
    rl = steps(run_dir)
    per_step = [line["step_s"] for line in rl]
    return {
        "run_dir": str(run_dir),
        "held_out_before": _rounded(record["evaluations"].get("before RL")),
        "held_out_after": _rounded(record["evaluations"].get("after RL")),
        "stop": record.get("reason") or record.get("phase"),
        "wall_clock_s": round(record.get("elapsed_s", 0.0), 1),
        "warmup_s": warmup.get("seconds"),
        "warmup_steps": warmup.get("steps"),
        "warmup_loss": [warmup.get("first_loss"), warmup.get("final_loss")],
        "rl_steps": len(rl),
        "seconds_per_step": round(statistics.mean(per_step), 1) if per_step else None,
        "step_seconds_split": {
            part: round(statistics.mean(line.get(part, 0.0) for line in rl), 1) for part in TIME_PARTS if rl
        },
        "reward_per_step": [round(line["reward_mean"], 4) for line in rl],
        "solve_rate_per_step": [round(line["solve_rate"], 4) for line in rl],
        "max_mismatch_kl": max((abs(line.get("mismatch_kl") or 0.0) for line in rl), default=None),
    }


def _rounded(rate: float | None) -> float | None:
    return None if rate is None else round(rate, 3)


def plot(runs: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 4.5))
    for name, run in runs.items():
        rewards = run["reward_per_step"]
        label = (
            f"{name}: held-out {run['held_out_before']} -> {run['held_out_after']}, {run['seconds_per_step']} s/step"
        )
        axes.plot(range(1, len(rewards) + 1), rewards, marker=".", label=label)
    axes.set_xlabel("RL step")
    axes.set_ylabel("mean reward of the episodes trained on")
    axes.set_title("SmolLM2-135M-Instruct on swe-toy, 2 CPU cores")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def side_by_side_jobs(steps: int, out: Path) -> dict[str, Path]:
    """The example as two jobs of `steps` RL steps: with its adapters, and with full fine-tuning at a tenth of
    the learning rate (LoRA wants about ten times full fine-tuning's); each its own name and checkpoints."""
    jobs = {}
    for mode in ("lora", "full"):
        job = yaml.safe_load(EXAMPLE.read_text())
        job["metadata"]["name"] = f"smollm2-side-by-side-{mode}"
        job["spec"]["training"]["totalSteps"] = steps
        job["spec"].pop("limits", None)
        job["spec"]["checkpoint"]["uri"] = str(out / mode / "checkpoints")
        if mode == "full":
            del job["spec"]["model"]["lora"]
            job["spec"]["training"]["learningRate"] = round(job["spec"]["training"]["learningRate"] / 10, 12)
        jobs[mode] = out / f"{mode}.yaml"
        jobs[mode].parent.mkdir(parents=True, exist_ok=True)
        jobs[mode].write_text(yaml.safe_dump(job, sort_keys=False))
    return jobs


def run_side_by_side(warmup: Path, steps: int, out: Path, modes: list[str]) -> None:
    """The jobs one after the other on the whole machine, each from a copy of the same warmed-up model."""
    jobs = side_by_side_jobs(steps, out)
    for mode in modes:
        run_dir = out / mode
        if run_dir.exists():
            shutil.rmtree(run_dir)
        shutil.copytree(warmup, run_dir / "warmup")  # `kuberl run` uses a warmed-up model it finds there
        argv = [str(KUBERL), "run", str(jobs[mode]), "--run-dir", str(run_dir), "--no-evaluate"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        with (out / f"{mode}.log").open("w") as log:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env, check=False).returncode
        print(f"{mode}: exit {code} (log {out / f'{mode}.log'})", flush=True)


def record(lora: Path, side_by_side: Path | None, notes: list[str]) -> None:
    runs = {"lora, 2 cores (make demo-lora)": summary(lora)}
    if side_by_side is not None:
        found = [m for m in ("lora", "full") if (side_by_side / m / "job.json").exists()]
        runs |= {f"same steps, same warmed-up model: {m}": summary(side_by_side / m) for m in found}
    data = {
        "what": "make demo-lora: SmolLM2-135M-Instruct with rank-16 LoRA on swe-toy (warm-up, then GRPO) within "
        "limits.maxWallClock 60m on 2 CPU cores; held-out solve rate before and after RL; reward and seconds per RL "
        "step; the same recipe with full fine-tuning side by side (same steps, same warmed-up model)",
        "goal": "held-out solve rate at least 0.3 above the warm-up's within 60 minutes",
        "commit": commit(),
        "machine": machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "make demo-lora; benchmarks/lora_learning.py side-by-side and record",
        "runs": runs,
        "notes": notes,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    plot(runs, PLOT)
    print(OUT, PLOT)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    both = commands.add_parser("side-by-side", help="RL with LoRA and with full fine-tuning at once, a core each.")
    both.add_argument("--warmup", required=True, help="The warm-up folder of a demo-lora run (RUN_DIR/warmup).")
    both.add_argument("--steps", type=int, default=5, help="RL steps of each run.")
    both.add_argument("--out", default="runs/lora-side-by-side", help="Folder of the two runs.")
    both.add_argument("--modes", nargs="+", default=["lora", "full"], choices=["lora", "full"], help="Which to run.")
    rec = commands.add_parser("record", help="Write the measured JSON and the plot from run folders.")
    rec.add_argument("--lora", required=True, help="The run folder of examples/swe-toy-smollm2-lora.yaml.")
    rec.add_argument("--side-by-side", default=None, help="The folder `side-by-side` wrote.")
    rec.add_argument("--note", action="append", default=[], help="A note to keep with the data (repeat).")
    args = parser.parse_args(argv)
    if args.command == "side-by-side":
        run_side_by_side(Path(args.warmup), args.steps, Path(args.out), args.modes)
    else:
        record(Path(args.lora), Path(args.side_by_side) if args.side_by_side else None, args.note)


if __name__ == "__main__":
    main()
