"""Recovery from a lost rollout server, with `kuberl run` on this machine: seconds from the kill to a
replacement serving, to full throughput again (a step as fast as the median before), and the learner's
extra idle seconds meanwhile; with one rollout server and with two (the survivor keeps serving)."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

# the replacement serves about 27 s after the kill. With two servers a step took about 3.7 s while an idle
# server held each of the learner's polls for its share of the wait; since it answers at once, 1.3-1.5 s
# (3 s while one server is down), so 20 steps after the kill only just see the replacement join: 28 do
KILL_AT, STEPS = 4, 32


def measure(work: Path, model: Path, rollouts: int) -> dict[str, float]:
    import yaml

    from kuberl.api.rljob import RLJob
    from kuberl_app.one_machine.progress import ProgressPrinter
    from kuberl_app.one_machine.runner import run_job

    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": f"recovery-{rollouts}"},
        "spec": {
            "model": {"uri": str(model), "dtype": "float32", "maxContextTokens": 2048},
            "algorithm": {"groupSize": 4, "dynamicSampling": False},  # untrained: no signal
            "training": {"totalSteps": STEPS, "trajectoriesPerStep": 16, "learningRate": 1e-4},
            "environment": {"maxTurns": 3, "maxTokensPerTrajectory": 1024},
            "rollout": {
                "replicas": rollouts,
                "concurrentSessions": 32,
                "maxTokensPerTurn": 48,
                "engine": {"maxNumSeqs": 32, "maxModelLen": 2048},
            },
            "checkpoint": {"intervalSteps": 100},
        },
    }
    path = work / f"job-{rollouts}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    killed: list[float] = []

    def kill(line: dict, supervisor) -> None:
        if line["step"] == KILL_AT and not killed:
            killed.append(time.time())
            supervisor.kill("rollout-0")

    run_dir = work / f"run-{rollouts}"
    record = run_job(RLJob.from_manifest(manifest), path, run_dir, str(model), out=ProgressPrinter(), on_step=kill)
    import json

    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    ready = [e["time"] for e in record.events if e["process"] == "rollout-0" and e["event"] == "ready"][-1]
    before = [line for line in lines if line["step"] <= KILL_AT]
    after = [line for line in lines if line["step"] > KILL_AT]
    normal_step = statistics.median(line["step_s"] for line in before[1:])  # the first step warms vLLM up
    normal_wait = statistics.median(line["wait_s"] for line in before[1:])
    full = next((line for line in after if line["time"] > ready and line["step_s"] <= 1.25 * normal_step), None)
    affected = [line for line in after if line["time"] - line["step_s"] < ready]
    return {
        "rollout_servers": rollouts,
        "steps": record.step,
        "replacement_serving_s": round(ready - killed[0], 1),
        "full_throughput_again_s": round(full["time"] - killed[0], 1) if full else None,
        "learner_extra_idle_s": round(sum(max(0.0, line["wait_s"] - normal_wait) for line in affected), 1),
        "median_step_s_before": round(normal_step, 2),
        "restarts": record.restarts,
        # the report's recovery timeline: seconds from the kill to the replacement serving, and per step
        # [seconds from the kill to the step's end, step seconds, learner wait seconds]
        "timeline": {
            "ready_s": round(ready - killed[0], 1),
            "steps": [[round(x["time"] - killed[0], 1), x["step_s"], x["wait_s"]] for x in lines],
        },
    }


def run() -> dict[str, object]:
    from recipes.swe_toy.tiny_model import build_tiny_model

    with tempfile.TemporaryDirectory(prefix="kuberl-recovery-bench-") as tmp:
        work = Path(tmp)
        model = build_tiny_model(work / "model", hidden_size=64, layers=2, seed=1)
        return {f"{n}_rollout_servers": measure(work, model, n) for n in (1, 2)}


if __name__ == "__main__":
    print(run())
