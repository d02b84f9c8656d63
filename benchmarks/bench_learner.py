"""Learner throughput (tokens/s of full train steps) with 1 and 2 processes on CPU (gloo), for the tiny
model and SmolLM2-135M (when `make bench` installed it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def torchrun(world: int, model: Path, out: Path, batch: int, length: int, steps: int) -> dict:
    argv = [
        str(Path(sys.executable).parent / "torchrun"),
        "--standalone",
        "--nproc_per_node",
        str(world),
        str(Path(__file__).resolve().parent / "learner_throughput.py"),
        str(model),
        str(out),
        str(batch),
        str(length),
        str(steps),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // world))}
    subprocess.run(argv, check=True, capture_output=True, env=env, timeout=1800)
    return json.loads(out.read_text())


def run() -> dict[str, object]:
    from kuberl.modeling.smollm import convert_smollm2, smollm2_gguf
    from recipes.swe_toy.tiny_model import build_tiny_model

    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory(prefix="kuberl-learner-bench-") as tmp:
        work = Path(tmp)
        models = {"tiny": (build_tiny_model(work / "tiny", hidden_size=128, layers=4, heads=4), 8, 256, 4)}
        if smollm2_gguf() is not None:
            models["smollm2_135m"] = (convert_smollm2(work / "smollm2"), 4, 256, 2)
        for name, (path, batch, length, steps) in models.items():
            out[name] = {str(w): torchrun(w, path, work / f"{name}-{w}.json", batch, length, steps) for w in (1, 2)}
            print(f"[bench]   learner {name}: {out[name]}", flush=True)
    return out


if __name__ == "__main__":
    print(run())
