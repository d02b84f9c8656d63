"""Record `make demo-lora` runs as data: a pretrained model (SmolLM2-135M-Instruct) learning swe-toy with LoRA, and
the same recipe with full fine-tuning side by side.

    .venv/bin/python benchmarks/lora_learning.py --lora runs/swe-toy-smollm2-lora [--full RUN_DIR]

reads each run's folder (job.json: held-out solve rates and the stop; warmup/warmup.json; metrics.jsonl: reward
and time per RL step) and writes benchmarks/measured/lora_smollm2_learning.json and
docs/img/lora-smollm2-learning.png (reward per step of each run, the held-out solve rates).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import commit, machine  # benchmarks/run.py: the machine and the commit every result carries

REPO = Path(__file__).resolve().parents[1]
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
        "held_out_before": record["evaluations"].get("before RL"),
        "held_out_after": record["evaluations"].get("after RL"),
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
    axes.set_ylabel("mean reward of the step's episodes")
    axes.set_title("SmolLM2-135M-Instruct on swe-toy, 2 CPU cores")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lora", required=True, help="The run folder of examples/swe-toy-smollm2-lora.yaml.")
    parser.add_argument("--full", default=None, help="A run folder of the same recipe without spec.model.lora.")
    parser.add_argument("--note", action="append", default=[], help="A note to keep with the data (repeat).")
    args = parser.parse_args(argv)
    runs = {"lora": summary(Path(args.lora))}
    if args.full:
        runs["full fine-tuning"] = summary(Path(args.full))
    data = {
        "what": "make demo-lora: SmolLM2-135M-Instruct with rank-16 LoRA on swe-toy (warm-up, then GRPO) within "
        "limits.maxWallClock 60m on 2 CPU cores; held-out solve rate before and after RL; reward and seconds per RL "
        "step; the same recipe with full fine-tuning side by side",
        "goal": "held-out solve rate at least 0.3 above the warm-up's within 60 minutes",
        "commit": commit(),
        "machine": machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": "make demo-lora; benchmarks/lora_learning.py",
        "runs": runs,
        "notes": args.note,
    }
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    plot(runs, PLOT)
    print(OUT, PLOT)


if __name__ == "__main__":
    main()
