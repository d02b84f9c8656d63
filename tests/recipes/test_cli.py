"""`python -m recipes.swe_toy`: the tiny model, the demonstrations file an RLJob's warm-up reads, the credit
report on a run's folders."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner
from conftest import REPO
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.demonstration_files import read_demonstrations
from recipes.swe_toy.cli import main

QUICK_BUILD = ("--hidden-size", "32", "--layers", "1", "--no-copy-pretraining")


def recipe(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def job_file(tmp_path, **training) -> str:
    doc = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "recipe"},
        "spec": {
            "model": {"uri": str(tmp_path / "model")},
            "training": {"seed": 5, **training},
            "environment": {"name": "swe-toy", "tasks": {"count": 60, "split": "train", "evalSplit": "test"}},
            "reward": {"function": "swe-toy-tests"},
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def test_tiny_model_writes_a_loadable_model(tmp_path):
    result = recipe("tiny-model", str(tmp_path / "tiny"), *QUICK_BUILD)
    assert result.exit_code == 0, result.output
    assert "copy pretraining" not in result.output
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny")
    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_attention_heads) == (32, 1, 1)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "tiny")
    assert tokenizer.eos_token == "<|end|>" and (tmp_path / "tiny" / "token_ranking.json").exists()


def test_demonstrations_writes_a_file_the_warm_up_reads(tmp_path):
    out = tmp_path / "data" / "demos.jsonl"  # its folder is made
    argv = [sys.executable, "-m", "recipes.swe_toy", "demonstrations", job_file(tmp_path), "--out", str(out)]
    argv += ["--count", "6", "--expert-fraction", "0.5", "--wrong-edit", "candidate", "--recovery-fraction", "0"]
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 6 demonstrations" in result.stdout and "3 solved their task" in result.stdout
    demos = read_demonstrations(str(out))
    assert [d.reward for d in demos] == [0.0, 1.0] * 3
    assert all(d.task_id.startswith("swe-toy-") for d in demos)
    assert json.loads(out.read_text().splitlines()[0])["taskId"] == demos[0].task_id  # the camelCase wire form


@pytest.mark.slow
def test_demonstrations_take_the_seed_of_the_job_unless_given(tmp_path):
    def task_ids(*extra: str) -> list[str]:
        out = tmp_path / f"d{'-'.join(extra)}.jsonl"
        assert recipe("demonstrations", job_file(tmp_path), "--out", str(out), "--count", "4", *extra).exit_code == 0
        return [d.task_id for d in read_demonstrations(str(out))]

    assert task_ids() == task_ids("--seed", "5") != task_ids("--seed", "6")


def test_a_bad_option_is_refused_before_anything_is_played(tmp_path):
    result = CliRunner().invoke(main, ["demonstrations", job_file(tmp_path), "--out", "x", "--expert-fraction", "2"])
    assert result.exit_code == 2 and "--expert-fraction" in result.output
    result = CliRunner().invoke(main, ["demonstrations", job_file(tmp_path), "--out", "x", "--wrong-edit", "other"])
    assert result.exit_code == 2 and "unchanged" in result.output and "candidate" in result.output


def test_credit_says_why_there_is_no_report_when_a_folder_is_missing(tmp_path):
    result = recipe("credit", str(tmp_path / "run"), job_file(tmp_path))
    assert result.exit_code == 0
    assert "no report" in result.output and "warmup/model" in result.output
    assert not (tmp_path / "run" / "credit.json").exists()


def test_credit_reports_no_change_between_two_copies_of_one_model(tmp_path):
    run = tmp_path / "run"
    assert recipe("tiny-model", str(run / "warmup" / "model"), *QUICK_BUILD).exit_code == 0
    shutil.copytree(run / "warmup" / "model", run / "policy")
    result = recipe("credit", str(run), job_file(tmp_path))
    assert result.exit_code == 0, result.output
    report = json.loads((run / "credit.json").read_text())
    assert set(report) == {"correct edit", "check the error"}
    for numbers in report.values():
        assert numbers["before"] == numbers["after"] < 0 and numbers["change"] == 0
    assert "held-out tasks" in result.output


@pytest.mark.parametrize("args", [["--help"], ["demonstrations", "--help"]])
def test_the_module_runs_as_a_command(args):
    result = subprocess.run([sys.executable, "-m", "recipes.swe_toy", *args], capture_output=True, text=True)
    assert result.returncode == 0 and "python -m recipes.swe_toy" in result.stdout
