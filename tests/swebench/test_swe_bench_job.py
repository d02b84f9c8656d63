"""A job on instances made by the factory, end to end: `kuberl tasks check` passes on the factory's output, then
`kuberl run` trains RL steps on them (real sandbox sessions on the real repository, pytest scoring with the
hidden test patch, vLLM rollouts, the learner), `kuberl evaluate` reports a solve rate, and mini-swe-agent plays
episodes on them through the OpenAI surface. The tiny model solves none: this shows the loop, not learning."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from conftest import REPO

from kuberl.swebench.factory import make_instances
from kuberl.swebench.instances import load_instances
from kuberl_app.one_machine.task_check import check_instances
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

PACKAGE = "inflection==0.5.1"
STEPS = 3


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory):
    work = Path(tempfile.mkdtemp(prefix="kuberl-swe-job-", dir="/tmp"))  # session users pass through it
    os.chmod(work, 0o711)
    mirror, environments, instances = work / "mirror", work / "environments", work / "instances.jsonl"
    make_instances([PACKAGE], mirror, environments, instances, per_package=4, seed=0)
    model = build_tiny_model(work / "model", hidden_size=64, layers=2, seed=4)
    yield work, mirror, environments, instances, model
    shutil.rmtree(work, ignore_errors=True)


def _job(made, name: str, **changes) -> Path:
    work, mirror, environments, instances, model = made
    document = yaml.safe_load((REPO / "examples" / "swe-bench-local.yaml").read_text())
    document["metadata"]["name"] = name
    spec = document["spec"]
    spec["model"]["uri"] = str(model)
    spec["environment"]["tasks"] = {
        "uri": str(instances),
        "repos": str(mirror),
        "environments": str(environments),
        "split": "train",
        "evalSplit": "train",  # a handful of instances: the hash-held-out split may be empty
    }
    spec["checkpoint"]["uri"] = str(work / name / "checkpoints")
    for section, values in changes.items():
        spec.setdefault(section, {}).update(values)
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return path


async def test_tasks_check_passes_on_the_factory_output(made):
    _, mirror, environments, instances, _ = made
    rows = load_instances(instances)
    assert len(rows) >= 3
    verdicts = await check_instances(rows, mirror, environments)
    assert [v.line() for v in verdicts if not v.valid] == []


def _run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", **env}
    return subprocess.run(argv, capture_output=True, text=True, env=environment, timeout=1500, check=False)


def test_kuberl_run_trains_on_made_instances_and_evaluate_reports_a_solve_rate(made):
    work = made[0]
    job = _job(made, "swe-bench-run")
    run_dir = work / "swe-bench-run"
    done = _run([sys.executable, "-m", "kuberl_app.cli", "run", str(job), "--run-dir", str(run_dir)])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == list(range(1, STEPS + 1))
    assert all(line["trajectories"] >= 4 for line in lines)
    assert (run_dir / "learning_curve.png").stat().st_size > 10_000
    record = json.loads((run_dir / "job.json").read_text())
    assert record["phase"] == "Succeeded", record
    summary = _run(
        [
            sys.executable,
            "-m",
            "kuberl_app.cli",
            "evaluate",
            str(job),
            "--model",
            str(run_dir / "policy"),
            "--split",
            "train",
        ]
    )
    assert summary.returncode == 0, summary.stderr[-3000:]
    evaluation = json.loads((run_dir / "evaluation.json").read_text())
    assert 0.0 <= evaluation["solve_rate"] <= 1.0 and evaluation["tasks"] >= 1


def test_mini_swe_agent_plays_episodes_on_made_instances(made):
    work = made[0]
    saved = work / "mswea"
    job = _job(
        made,
        "swe-bench-mswea",
        environment={"agent": "helpers.mini_swe_agent_job:solve", "maxTurns": 8},
        training={"totalSteps": 1},
    )
    run_dir = work / "swe-bench-mswea"
    done = _run(
        [sys.executable, "-m", "kuberl_app.cli", "run", str(job), "--run-dir", str(run_dir), "--no-evaluate"],
        PYTHONPATH=str(REPO / "tests"),
        KUBERL_TEST_MSWEA_DIR=str(saved),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trajectories = list(saved.glob("*.json"))
    assert len(trajectories) >= 4
    # mini-swe-agent's commands ran in the repository's workspace: each saw its observations
    messages = json.loads(trajectories[0].read_text())["messages"]
    assert any("exit code" in str(m.get("content")) for m in messages)
