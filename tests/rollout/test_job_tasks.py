"""A job whose reward is swe-toy-tests refuses, before anything starts, a task file without failToPass: one
line naming the file, the field and what to do, as a usage error (exit 2)."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner
from conftest import with_spec

from kuberl.api.rljob import RLJob
from kuberl.rewards import swe_toy_tests_reward
from kuberl.suites.store import write_jsonl
from kuberl.suites.swe_toy import generate
from kuberl_app.cli import main
from kuberl_rollout.server import load_job_tasks

TASKS = generate(3)


@pytest.fixture
def old_task_file(tmp_path):
    """Tasks written before failToPass existed."""
    path = tmp_path / "old-tasks.jsonl"
    write_jsonl([t.model_copy(update={"fail_to_pass": None, "pass_to_pass": None}) for t in TASKS], path)
    return path


def job_file(tmp_path, tasks_uri) -> str:
    manifest = with_spec(environment={"tasks": {"uri": str(tasks_uri)}})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return str(path)


def test_tasks_with_fail_to_pass_load_for_swe_toy_tests(tmp_path):
    write_jsonl(TASKS, tmp_path / "tasks.jsonl")
    job = RLJob.from_manifest(with_spec(environment={"tasks": {"uri": str(tmp_path / "tasks.jsonl")}}))
    assert load_job_tasks(job, swe_toy_tests_reward) == TASKS
    builtin = RLJob.from_manifest(with_spec())
    assert len(load_job_tasks(builtin, swe_toy_tests_reward)) == 400


def test_a_task_file_without_fail_to_pass_is_refused_with_the_file_and_the_field(tmp_path, old_task_file):
    job = RLJob.from_manifest(with_spec(environment={"tasks": {"uri": str(old_task_file)}}))
    with pytest.raises(ValueError) as caught:
        load_job_tasks(job, swe_toy_tests_reward)
    message = str(caught.value)
    assert message.startswith(f"{old_task_file}: 3 of 3 tasks cannot be scored; first: task 'swe-toy-0000' has no ")
    assert "failToPass" in message and "add them to the task file" in message and "\n" not in message
    assert load_job_tasks(job, lambda ctx: 0.0) == [  # another reward does not need them
        t.model_copy(update={"fail_to_pass": None, "pass_to_pass": None}) for t in TASKS
    ]


@pytest.mark.parametrize("command", ["rollout-server", "run"])
def test_the_cli_exits_2_on_such_a_file(tmp_path, old_task_file, monkeypatch, command):
    monkeypatch.setenv("KUBERL_SANDBOX_TOKEN", "token")
    monkeypatch.setenv("KUBERL_JOB_TOKEN", "job-token")
    argv = [command, job_file(tmp_path, old_task_file)]
    argv += ["--sandbox-url", "http://127.0.0.1:1"] if command == "rollout-server" else ["--no-evaluate"]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert str(old_task_file) in result.output and "has no failToPass" in result.output
