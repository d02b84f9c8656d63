"""`kuberl run` end to end on CPU (real sandbox, vLLM rollout and learner processes): the seed's
fault-recovery checklist scaled down, the circuit breakers, and the CLI's handling of a previous run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import REPO
from helpers.polling import wait_for
from helpers.tiny_job import tiny_job_spec
from prometheus_client.parser import text_string_to_metric_families

from kuberl.api.rljob import RLJob
from kuberl_app.one_machine.progress import ProgressPrinter
from kuberl_app.one_machine.runner import run_job
from kuberl_trainer.checkpoints.store import CheckpointStore
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

FAULTS = Path(__file__).resolve().parents[1] / "faults"
"""sitecustomize.py there injects faults from outside the product (see its docstring)."""


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("run") / "model", hidden_size=64, layers=2, seed=4)


def job(name: str, model, tmp_path, **sections) -> tuple[RLJob, object]:
    spec = tiny_job_spec(model, **sections)
    manifest = {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": name}, "spec": spec}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return RLJob.from_manifest(manifest), path


def metrics(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


IN_FLIGHT = {
    "rollout-0": (("rollout-0", ("kuberl_rollout_active_sessions", "kuberl_rollout_queued_trajectories")),),
    # a sandbox session lives a fraction of a second in this job: the rollout's running episodes (each holding
    # or opening its session) widen the window in which a kill finds the sandbox in use
    "sandbox-0": (
        ("sandbox-0", ("kuberl_sandbox_sessions_open",)),
        ("rollout-0", ("kuberl_rollout_active_sessions",)),
    ),
}
"""Where to look, and which gauges say a server holds episodes: killed with none, it would have nothing to lose."""


SCRAPE = httpx.Client(timeout=1)
"""One client for the tight polling below: a new one builds a TLS context each time (tens of ms of CPU)."""


def _holds_episodes(run_dir: Path, pod: str) -> bool:
    targets = json.loads((run_dir / "prometheus_targets.json").read_text())
    for source, gauges in IN_FLIGHT[pod]:
        address = next(t["targets"][0] for t in targets if t["labels"]["pod"] == source)
        try:
            text = SCRAPE.get(f"http://{address}/metrics").text
        except httpx.HTTPError:
            continue
        if any(s.value > 0 for f in text_string_to_metric_families(text) if f.name in gauges for s in f.samples):
            return True
    return False


def test_rollout_sandbox_and_learner_failures_cost_no_training(model, tmp_path):
    rl_job, path = job("faults", model, tmp_path, training={"totalSteps": 8}, checkpoint={"intervalSteps": 2})
    killed: dict[str, float] = {}

    def inject(line: dict, supervisor) -> None:
        for step, name in ((2, "rollout-0"), (4, "sandbox-0"), (6, "learner")):
            if line["step"] == step and name not in killed:
                if name in IN_FLIGHT:  # steps of this tiny job take a fraction of a second: kill mid-wave
                    wait_for(
                        f"{name} to hold episodes", lambda pod=name: _holds_episodes(tmp_path / "run", pod), 30, 0.005
                    )
                killed[name] = time.time()
                supervisor.kill(name)

    record = run_job(rl_job, path, tmp_path / "run", str(model), out=ProgressPrinter(), on_step=inject)
    assert (record.phase, record.reason, record.step) == ("Succeeded", "Completed", 8), record.message
    assert record.restarts == {"rollout": 1, "sandbox": 1, "learner": 1}
    lines = metrics(tmp_path / "run")
    steps = [line["step"] for line in lines]
    # up to the learner's kill every step came once, in order: losing a rollout server or a sandbox cost no
    # step and did not stop the learner
    assert steps[:6] == [1, 2, 3, 4, 5, 6]
    learner_starts = [e for e in record.events if e["process"] == "learner" and e["event"] == "started"]
    assert len(learner_starts) == 2 and learner_starts[1]["time"] > killed["learner"]
    # the lost server's and the lost sandbox's episodes were run again, not dropped
    assert sum(line["resubmitted"] for line in lines[:6]) >= 1
    assert all(line["trajectories"] == 4 for line in lines)
    # the restarted learner resumed from its newest complete checkpoint (4 or 6), not from scratch; a step the
    # killed learner finished after its last checkpoint (it may finish step 7 before the kill lands) is redone
    before = [line["step"] for line in lines if line["time"] < learner_starts[1]["time"]]
    after = [line["step"] for line in lines if line["time"] > learner_starts[1]["time"]]
    assert before == list(range(1, len(before) + 1)) and len(before) >= 6
    assert after[0] - 1 in (4, 6) and after == list(range(after[0], 9)), (before, after)
    ready = [e["time"] for e in record.events if e["process"] == "rollout-0" and e["event"] == "ready"]
    replacement_s = ready[1] - killed["rollout-0"]
    print(f"rollout replacement serving {replacement_s:.1f} s after the kill")
    assert replacement_s < 90  # goal 30 s; vLLM's start on 2 shared CPU cores dominates
    assert [m.step for m in CheckpointStore(str(tmp_path / "run" / "checkpoints")).complete()][-1] == 8
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 10_000


@pytest.mark.parametrize(
    ("case", "sections", "env", "expected"),
    [
        ("max-steps", {"limits": {"maxSteps": 3}}, {}, ("Stopped", "MaxStepsReached")),
        (
            "wall-clock",
            {"training": {"totalSteps": 1000}, "limits": {"maxWallClock": "20s"}},
            {},
            ("Stopped", "MaxWallClockReached"),
        ),
        (
            "nan",
            {"training": {"totalSteps": 1000}, "limits": {"maxNonFiniteSteps": 2}},
            {"KUBERL_TEST_NAN_FROM_STEP": "2", "PYTHONPATH": str(FAULTS)},
            ("Failed", "NonFiniteLoss"),
        ),
        (
            "no-signal",
            {
                "training": {"totalSteps": 1000},
                "algorithm": {"dynamicSampling": True},
                "limits": {"maxBatchesWithoutSignal": 2},
            },
            {},
            ("Failed", "NoLearningSignal"),
        ),
    ],
)
def test_circuit_breakers(model, tmp_path, case, sections, env, expected):
    _, path = job(case, model, tmp_path, **sections)
    argv = [sys.executable, "-m", "kuberl_app.cli", "run", str(path), "--run-dir", str(tmp_path / "run")]
    argv += [] if case == "max-steps" else ["--no-evaluate"]  # one case also measures the held-out split
    result = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    record = json.loads((tmp_path / "run" / "job.json").read_text())
    assert (record["phase"], record["reason"]) == expected, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.returncode == (1 if expected[0] == "Failed" else 0)
    assert f"({expected[1]})" in result.stdout
    complete = [m.step for m in CheckpointStore(str(tmp_path / "run" / "checkpoints")).complete()]
    if case == "max-steps":
        assert record["step"] == 3 and complete == [3]  # stopped at step 3 with a final checkpoint
        assert set(record["evaluations"]) == {"before RL", "after RL"}
        assert all(0.0 <= v <= 1.0 for v in record["evaluations"].values())
    if case == "nan":
        assert record["step"] == 3 and complete == [3]  # steps 2 and 3 skipped their updates, then it stopped
        assert [line["skipped"] for line in metrics(tmp_path / "run")] == [0, 1, 1]
    if case == "no-signal":  # the tiny model solves nothing: every group dropped, no step, no endless wait
        assert record["step"] == 0 and complete == [] and "maxBatchesWithoutSignal: 2" in record["message"]
    if case == "wall-clock" and record["step"]:
        assert complete == [record["step"]]


def test_a_previous_run_is_never_overwritten(model, tmp_path):
    _, path = job("again", model, tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job.json").write_text("{}")
    result = subprocess.run(
        [sys.executable, "-m", "kuberl_app.cli", "run", str(path), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert result.returncode == 2 and "--resume" in result.stderr
    assert (tmp_path / "run" / "job.json").read_text() == "{}"


def test_model_on_the_command_line_replaces_the_jobs_model(model, tmp_path):
    manifest = yaml.safe_load(job("hub", model, tmp_path)[1].read_text())
    manifest["spec"]["model"]["uri"] = "Qwen/Qwen3-8B"  # a hub id: refused unless --model replaces it
    path = tmp_path / "hub.yaml"
    path.write_text(yaml.safe_dump(manifest))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "job.json").write_text("{}")

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "kuberl_app.cli", "run", str(path), "--run-dir", str(tmp_path / "run"), *extra]
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)

    refused = run()
    assert refused.returncode == 2 and "spec.model.uri" in refused.stderr and "huggingface-cli" in refused.stderr
    # with --model the job gets as far as its run folder (kept: it holds an earlier run)
    replaced = run("--model", str(model))
    assert replaced.returncode == 2 and "--resume" in replaced.stderr and "spec.model.uri" not in replaced.stderr
    not_a_model = run("--model", str(tmp_path))
    assert not_a_model.returncode == 2 and f"{tmp_path}: no config.json" in not_a_model.stderr


def test_ctrl_c_stops_with_a_final_checkpoint_and_resume_continues(model, tmp_path):
    _, path = job("resume", model, tmp_path, training={"totalSteps": 6})
    argv = [
        sys.executable,
        "-m",
        "kuberl_app.cli",
        "run",
        str(path),
        "--run-dir",
        str(tmp_path / "run"),
        "--no-evaluate",
    ]
    first = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and first.poll() is None:
        if (tmp_path / "run" / "metrics.jsonl").exists() and metrics(tmp_path / "run"):
            break
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)  # what Ctrl-C sends
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output[-3000:]
    record = json.loads((tmp_path / "run" / "job.json").read_text())
    stopped_at = record["step"]
    assert record["phase"] == "Stopped" and "SIGINT" in record["message"] and 1 <= stopped_at < 6
    store = CheckpointStore(str(tmp_path / "run" / "checkpoints"))
    assert [m.step for m in store.complete()] == [stopped_at]  # the final checkpoint of the stop

    again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    record = json.loads((tmp_path / "run" / "job.json").read_text())
    assert (record["phase"], record["reason"], record["step"], record["runs"]) == ("Succeeded", "Completed", 6, 2)
    steps = [line["step"] for line in metrics(tmp_path / "run")]
    assert steps == list(range(1, 7))  # continued from the checkpoint: nothing lost, nothing repeated
