"""The swe-toy suite: deterministic, well-formed tasks whose test output names the fix; JSONL loading."""

from __future__ import annotations

import collections
import fnmatch
import io
import json
import re
import subprocess
import sys
import types
import unittest
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import REPO
from pydantic import ValidationError

from kuberl.api.environment import Task
from kuberl.api.spec import EnvironmentSpec
from kuberl.suites import BUILTIN_SUITES, environment_tasks, load_tasks
from kuberl.suites.store import read_jsonl, write_jsonl
from kuberl.suites.swe_toy import BUG_KINDS, MAX_MODULE_LINES, generate

TASKS = generate()
# Every 13th task: 31 tasks that cover every bug kind, run for real in subprocesses.
SAMPLE = TASKS[::13]


def wrong_candidates(task: Task) -> list[str]:
    return [c for c in task.metadata["candidates"] if c != task.metadata["fix"]]


def with_edit(task: Task, replacement: str) -> dict[str, str]:
    """The task's files with the buggy expression replaced, as the agent's `replace` tool would."""
    file = task.metadata["file"]
    return {**task.files, file: task.files[file].replace(task.metadata["buggy"], replacement, 1)}


def hidden_file(task: Task) -> str:
    return f"hidden_test_{task.metadata['module']}.py"


# ------------------------------------------------------------------------------ determinism and splits
def test_same_seed_same_tasks_and_another_seed_other_tasks():
    assert generate(40) == TASKS[:40]
    assert [t.files for t in generate(40, seed=1)] != [t.files for t in TASKS[:40]]


def test_ids_and_splits_are_stable_when_the_suite_grows():
    assert [t.task_id for t in TASKS[:3]] == ["swe-toy-0000", "swe-toy-0001", "swe-toy-0002"]
    assert len({t.task_id for t in TASKS}) == len(TASKS)
    assert [(t.task_id, t.split) for t in generate(50)] == [(t.task_id, t.split) for t in TASKS[:50]]


def test_the_same_tasks_in_another_process_with_another_hash_seed():
    # str hashing is randomised per process; the generator must not depend on it.
    code = "from kuberl.suites.swe_toy import generate; print(generate(60)[-1].model_dump_json())"
    env = {"PYTHONHASHSEED": "12345", "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert Task.model_validate_json(out) == TASKS[59]


def test_about_a_quarter_of_the_tasks_are_held_out():
    held_out = sum(t.split == "test" for t in TASKS) / len(TASKS)
    assert 0.2 <= held_out <= 0.3
    assert all(t.split == "train" for t in generate(30, test_fraction=0.0))


def test_every_task_validates_through_its_wire_form():
    assert all(Task.model_validate(t.to_manifest()) == t for t in TASKS)


def test_every_bug_kind_is_used_and_sampled():
    assert {t.metadata["bugKind"] for t in TASKS} == set(BUG_KINDS) == {t.metadata["bugKind"] for t in SAMPLE}
    assert len(BUG_KINDS) >= 4


# ------------------------------------------------------------------------------ the shape of every task
@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_task_shape(task):
    meta = task.metadata
    module, file = meta["module"], meta["file"]
    assert set(task.files) == {file, f"test_{module}.py"} and set(task.hidden_tests) == {hidden_file(task)}
    assert not fnmatch.fnmatch(hidden_file(task), "test*.py")  # `python -m unittest` never runs it early
    assert module not in sys.stdlib_module_names and file == f"{module}.py"
    assert task.files[file].count(meta["buggy"]) == 1
    assert task.files[file].count("\n") <= MAX_MODULE_LINES
    candidates = meta["candidates"]
    assert 3 <= len(candidates) <= 4 and len(set(candidates)) == len(candidates) and meta["fix"] in candidates
    assert meta["buggy"] not in candidates
    assert not any(c in task.files[file] for c in candidates)
    assert task.test_command == "python -m unittest -q"
    assert file in task.prompt and "submit" in task.prompt
    # FAIL_TO_PASS: one hidden method per case of the buggy function; PASS_TO_PASS: every other method.
    prefix = f"hidden_test_{module}.HiddenTest{module.title().replace('_', '')}."
    f2p = [f"{prefix}test_{meta['function']}_{i}" for i in (1, 2, 3)]
    assert task.fail_to_pass == f2p
    methods = {f"{prefix}{name}" for name in re.findall(r"def (test\w+)\(", task.hidden_tests[hidden_file(task)])}
    assert task.pass_to_pass and set(task.pass_to_pass) == methods - set(f2p)


# ------------------------------------------------------------------ every task, run in this process (fast)
@contextmanager
def imported(files: dict[str, str]):
    """The workspace's non-test modules as importable modules, removed again afterwards."""
    names = [path[:-3] for path in files if path.endswith(".py") and not path.startswith(("test_", "hidden_test_"))]
    saved = {name: sys.modules.get(name) for name in names}
    try:
        for name in names:
            module = types.ModuleType(name)
            exec(compile(files[f"{name}.py"], f"{name}.py", "exec"), module.__dict__)
            sys.modules[name] = module
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def run_in_process(files: dict[str, str], test_path: str) -> tuple[unittest.TestResult, str]:
    """Run one unittest file of a workspace here, without a subprocess; returns the result and its output."""
    with imported(files):
        test_module = types.ModuleType(test_path[:-3])
        exec(compile(files[test_path], test_path, "exec"), test_module.__dict__)
        suite = unittest.defaultTestLoader.loadTestsFromModule(test_module)
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=0).run(suite)
    return result, stream.getvalue()


def failed(result: unittest.TestResult) -> int:
    return len(result.failures) + len(result.errors)


def failed_ids(result: unittest.TestResult) -> set[str]:
    return {test.id() for test, _ in result.failures + result.errors}


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.task_id)
def test_task_behaviour_in_process(task):
    meta, visible = task.metadata, f"test_{task.metadata['module']}.py"
    result, output = run_in_process(task.files, visible)
    assert failed(result) == 1 and not result.errors and meta["fix"] in output
    assert not any(wrong in output for wrong in wrong_candidates(task))

    fixed = {**with_edit(task, meta["fix"]), **task.hidden_tests}
    assert run_in_process(fixed, visible)[0].wasSuccessful()
    result, _ = run_in_process(fixed, hidden_file(task))
    assert result.wasSuccessful() and result.testsRun == len(task.fail_to_pass) + len(task.pass_to_pass) >= 4

    # On the buggy module exactly the FAIL_TO_PASS tests fail: every PASS_TO_PASS one already passes.
    buggy_hidden = run_in_process({**task.files, **task.hidden_tests}, hidden_file(task))[0]
    assert failed_ids(buggy_hidden) == set(task.fail_to_pass)
    for wrong in wrong_candidates(task):  # a decoy leaves a FAIL_TO_PASS test failing
        decoy = run_in_process({**with_edit(task, wrong), **task.hidden_tests}, hidden_file(task))[0]
        assert failed_ids(decoy) & set(task.fail_to_pass)


# --------------------------------------------------------------------- a sample, run for real in subprocesses
def run(workspace: Path, *command: str) -> subprocess.CompletedProcess[str]:
    # -B: an edit that keeps a file's size within the same second would otherwise run its stale cached bytecode.
    argv = [sys.executable, "-B", *command]
    return subprocess.run(argv, cwd=workspace, capture_output=True, text=True, timeout=30)


def write_workspace(workspace: Path, files: dict[str, str]) -> None:
    for path, content in files.items():
        (workspace / path).write_text(content, encoding="utf-8")


@pytest.mark.parametrize("task", SAMPLE, ids=lambda t: t.task_id)
def test_task_in_a_subprocess(task, tmp_path):
    meta = task.metadata
    hidden_module = hidden_file(task)[:-3]
    write_workspace(tmp_path, task.files)
    # -I: the task needs nothing but the standard library and no environment variables.
    buggy = run(tmp_path, "-I", "-m", "unittest", "-q")
    assert buggy.returncode != 0 and meta["fix"] in buggy.stderr
    assert not any(wrong in buggy.stderr for wrong in wrong_candidates(task))

    # The ids as the sandbox runs them: on the buggy module every FAIL_TO_PASS test fails, PASS_TO_PASS pass.
    write_workspace(tmp_path, task.hidden_tests)
    f2p = run(tmp_path, "-m", "unittest", "-q", *task.fail_to_pass)
    assert f"Ran {len(task.fail_to_pass)} tests" in f2p.stderr
    assert f"FAILED (failures={len(task.fail_to_pass)})" in f2p.stderr, f2p.stderr
    assert run(tmp_path, "-m", "unittest", "-q", *task.pass_to_pass).returncode == 0

    write_workspace(tmp_path, {**with_edit(task, meta["fix"]), **task.hidden_tests})
    assert run(tmp_path, "-I", "-m", "unittest", "-q").returncode == 0
    hidden = run(tmp_path, "-m", "unittest", "-q", hidden_module)
    assert hidden.returncode == 0, hidden.stderr
    resolved = run(tmp_path, "-m", "unittest", "-q", *task.fail_to_pass, *task.pass_to_pass)
    assert (
        resolved.returncode == 0 and f"Ran {len(task.fail_to_pass) + len(task.pass_to_pass)} tests" in resolved.stderr
    )

    for wrong in wrong_candidates(task):
        write_workspace(tmp_path, with_edit(task, wrong))
        assert run(tmp_path, "-m", "unittest", "-q", hidden_module).returncode != 0


def test_hidden_tests_run_under_isolated_mode_by_discovery(tmp_path):
    # Under -I the current folder is not importable by name; discovery with a pattern adds it.
    task = TASKS[0]
    write_workspace(tmp_path, {**with_edit(task, task.metadata["fix"]), **task.hidden_tests})
    result = run(tmp_path, "-I", "-m", "unittest", "discover", "-q", "-p", "hidden_test_*.py")
    assert result.returncode == 0 and "Ran" in result.stderr


# ------------------------------------------------------------------------------------- JSONL and loading
def test_jsonl_round_trip(tmp_path):
    path = tmp_path / "suite" / "tasks.jsonl"
    write_jsonl(TASKS[:20], path)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 20 and json.loads(lines[0])["taskId"] == "swe-toy-0000"
    assert read_jsonl(path) == TASKS[:20]
    assert load_tasks("ignored", uri=f"file://{path}") == TASKS[:20]
    assert load_tasks("ignored", uri=str(path), split="test") == [t for t in TASKS[:20] if t.split == "test"]


def test_unicode_survives_the_round_trip(tmp_path):
    task = Task(task_id="ünï", prompt="Réparez le bogue — s'il vous plaît", files={"a.py": "x = '日本'\n"})
    write_jsonl([task], tmp_path / "t.jsonl")
    assert "日本" in (tmp_path / "t.jsonl").read_text(encoding="utf-8")
    assert read_jsonl(tmp_path / "t.jsonl") == [task]


@pytest.mark.parametrize(
    ("bad_line", "words"),
    [
        ({"prompt": "p"}, ["taskId", "required"]),
        ({"taskId": "x", "prompt": "p", "files": {"../etc/passwd": ""}}, ["files", "relative path"]),
        ({"taskId": "x", "prompt": "p", "split": "validation"}, ["split"]),
        ({"taskId": "x", "prompt": "p", "hiddenTest": {}}, ["hiddenTest", "not permitted"]),
        ({"taskId": "x", "prompt": "p", "failToPass": ["hidden_test_x.T.test_a"]}, ["failToPass", "no hiddenTests"]),
        ({"taskId": "x", "prompt": "p", "failToPass": ["t; rm -rf /"]}, ["failToPass.0", "pattern"]),
        ("not json", ["not valid JSON"]),
        ([1, 2], ["expected a JSON object"]),
    ],
    ids=["missing", "path", "split", "unknown-field", "test-id-file", "test-id-shape", "json", "array"],
)
def test_a_bad_line_names_the_file_the_line_and_the_field(tmp_path, bad_line, words):
    path = tmp_path / "tasks.jsonl"
    write_jsonl(TASKS[:2], path)
    bad = bad_line if isinstance(bad_line, str) else json.dumps(bad_line)
    path.write_text(path.read_text(encoding="utf-8") + "\n" + bad + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"tasks\.jsonl line 4: ") as caught:
        load_tasks("swe-toy", uri=str(path))
    assert all(word in str(caught.value) for word in words), caught.value


def test_duplicate_task_ids_are_refused(tmp_path):
    path = tmp_path / "tasks.jsonl"
    write_jsonl([TASKS[0], TASKS[1], TASKS[0]], path)
    with pytest.raises(ValueError, match=r"line 3: taskId: duplicate 'swe-toy-0000', first on line 1"):
        read_jsonl(path)


def test_a_job_sizes_the_builtin_suite_and_earlier_tasks_keep_their_split():
    env = EnvironmentSpec.model_validate({"tasks": {"count": 600}})
    tasks = environment_tasks(env)
    assert len(tasks) == 600 and tasks[:400] == TASKS  # task i and its split do not depend on the count
    assert environment_tasks(env, "test") == [t for t in tasks if t.split == "test"]
    assert len(environment_tasks(EnvironmentSpec())) == len(TASKS)  # unset: the suite's default
    with pytest.raises(ValidationError, match=r"count \(600\) sizes a built-in suite; with uri set"):
        EnvironmentSpec.model_validate({"tasks": {"count": 600, "uri": "tasks.jsonl"}})


def test_builtin_suite_and_its_errors(tmp_path):
    assert "swe-toy" in BUILTIN_SUITES
    held_out = load_tasks("swe-toy", split="test")
    assert held_out == [t for t in TASKS if t.split == "test"]
    with pytest.raises(ValueError, match=r"unknown built-in task suite 'sweet-toy'; known suites: swe-toy"):
        load_tasks("sweet-toy")
    with pytest.raises(ValueError, match=r"unknown split 'dev'; expected one of: train, test"):
        load_tasks("swe-toy", split="dev")
    with pytest.raises(ValueError, match=r"use s3://bucket/key, file:///path or a local path"):
        load_tasks("swe-toy", uri="gs://bucket/tasks.jsonl")
    with pytest.raises(ValueError, match=r"missing\.jsonl: cannot read task file"):
        load_tasks("swe-toy", uri=str(tmp_path / "missing.jsonl"))


def test_docs_describe_the_format_and_every_field():
    doc = (REPO / "docs" / "tasks.md").read_text(encoding="utf-8")
    for field in Task.model_fields.values():
        assert f"`{field.alias}`" in doc
    example = next(line for line in doc.splitlines() if line.startswith('{"taskId"'))
    Task.model_validate(json.loads(example))
    assert "tasks.uri" in doc


def test_generated_kinds_are_spread():
    kinds = collections.Counter(t.metadata["bugKind"] for t in TASKS)
    assert min(kinds.values()) >= len(TASKS) // 10


def test_tasks_load_from_s3(tmp_path, monkeypatch):
    """A real S3 API (moto's server on 127.0.0.1) holding a task file."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for key, value in {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }.items():
            monkeypatch.setenv(key, value)
        write_jsonl(TASKS[:5], tmp_path / "tasks.jsonl")
        s3 = boto3.client("s3")
        s3.create_bucket(Bucket="suites")
        s3.upload_file(str(tmp_path / "tasks.jsonl"), "suites", "v1/tasks.jsonl")
        assert load_tasks("ignored", uri="s3://suites/v1/tasks.jsonl") == TASKS[:5]
        with pytest.raises(ValueError, match=r"s3://suites/nope.jsonl: cannot download it"):
            load_tasks("ignored", uri="s3://suites/nope.jsonl")
    finally:
        server.stop()
