"""`kuberl evaluate`: the held-out solve rate of a policy folder, served by the job's own rollout server and
sandbox; bad input is one line naming the field or file, exit 2."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import BASE_MANIFEST
from helpers.kuberl_cli import kuberl, kuberl_here
from helpers.tiny_job import tiny_job_spec

from kuberl.suites import load_tasks
from kuberl.suites.store import write_jsonl
from recipes.swe_toy.tiny_model import build_tiny_model

ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


def job_file(tmp_path: Path, spec: dict) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({**BASE_MANIFEST, "metadata": {"name": "evaluate-me"}, "spec": spec}))
    return str(path)


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def test_a_policy_folder_that_is_not_a_model_is_one_line_naming_it(tmp_path):
    job = job_file(tmp_path, {"model": {"uri": "runs/models/tiny-llama"}})
    (tmp_path / "policy").mkdir()
    error = one_line_error(kuberl_here("evaluate", job, "--model", str(tmp_path / "policy")))
    assert f"{tmp_path / 'policy'}: no config.json" in error


def test_the_older_grammar_is_answered_with_the_new_one(tmp_path):
    job = job_file(tmp_path, {"model": {"uri": "runs/models/tiny-llama"}})
    (tmp_path / "policy").mkdir()
    error = one_line_error(kuberl_here("evaluate", str(tmp_path / "policy"), "--job", job))
    assert "kuberl evaluate JOB.yaml --model POLICY_DIR" in error


def test_without_model_it_scores_the_runs_export_and_names_it_when_missing(tmp_path):
    job = job_file(tmp_path, {"model": {"uri": "runs/models/tiny-llama"}})
    error = one_line_error(kuberl_here("evaluate", job, "--run-dir", str(tmp_path / "run")))
    assert f"{tmp_path / 'run' / 'policy'}: no config.json" in error


def test_a_task_file_without_fail_to_pass_is_refused_naming_the_file_and_field(tmp_path):
    model = build_tiny_model(tmp_path / "m", hidden_size=64, layers=1, seed=1)
    tasks = [t.model_copy(update={"fail_to_pass": None, "pass_to_pass": None}) for t in load_tasks("swe-toy")[:2]]
    write_jsonl(tasks, tmp_path / "old.jsonl")
    job = job_file(tmp_path, tiny_job_spec(model))
    error = one_line_error(kuberl_here("evaluate", job, "--model", str(model), "--tasks", str(tmp_path / "old.jsonl")))
    assert "old.jsonl" in error and "failToPass" in error


def test_a_landing_floor_outside_zero_to_one_is_refused_naming_the_field(tmp_path):
    warmup = {"demonstrations": "d.jsonl", "landing": {"min": 1.5}}
    job = job_file(tmp_path, {"model": {"uri": "m"}, "training": {"warmup": warmup}})
    error = one_line_error(kuberl_here("validate", job))
    assert "spec.training.warmup.landing.min" in error


@pytest.mark.slow
def test_it_scores_a_task_file_and_writes_the_summary(tmp_path):
    model = build_tiny_model(tmp_path / "m", hidden_size=64, layers=1, seed=1)
    write_jsonl(load_tasks("swe-toy", split="test")[:3], tmp_path / "tasks.jsonl")
    job = job_file(tmp_path, tiny_job_spec(model))
    out = tmp_path / "eval.json"
    result = kuberl(
        "evaluate",
        job,
        "--model",
        str(model),
        "--tasks",
        str(tmp_path / "tasks.jsonl"),
        "--episodes",
        "2",
        "--output",
        str(out),
        env=ENGINE_ENV,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(out.read_text())
    # a random model solves nothing; every episode is accounted for
    assert (summary["tasks"], summary["episodes"], summary["solved"], summary["solve_rate"]) == (3, 6, 0, 0.0)
    assert summary["failed"] == 0 and summary["tasks_source"] == str(tmp_path / "tasks.jsonl")
    assert "held-out solve rate 0.00 (0/6 episodes of 3 tasks)" in result.stdout
    assert (tmp_path / "eval-logs" / "logs" / "rollout-0.log").exists()  # the servers' logs stay beside it
