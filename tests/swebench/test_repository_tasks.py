"""Tasks on a real repository in the real sandbox: the workspace at the base commit, the prepared environment,
scoring by pytest with the test patch (SWE-bench's rules), what the agent's code cannot change about it, gold
validation, and the tools on a repository. semver's source distribution is fetched by pip; nothing is mocked."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from helpers.swe_repos import F2P, P2P, REGRESSION_TESTS, make_dataset

from kuberl.api.environment import ToolCall
from kuberl.swebench.environments import prepare, recipe_for
from kuberl.swebench.instances import instance_task, load_instances
from kuberl_app.one_machine.task_check import check_instances, sandbox_settings
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.session_manager import SessionError, SessionManager
from kuberl_sandbox.tools import apply_tool

pytestmark = pytest.mark.slow


def _reachable_folder(prefix: str) -> Path:
    """A folder session users can pass through (pytest's own are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o711)
    return folder


@pytest.fixture(scope="module")
def dataset():
    work = _reachable_folder("kuberl-swe-")
    data = make_dataset(work)
    environments = work / "environments"
    instances = load_instances(data.instances)
    prepare(recipe_for(instances[0]), data.mirror, environments)
    yield data, instances, environments
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
async def manager(dataset):
    data, _, environments = dataset
    root = _reachable_folder("kuberl-swe-sandbox-")
    manager = SessionManager(sandbox_settings(root / "sandbox", data.mirror, environments), SandboxMetrics())
    manager.prepare()
    yield manager
    await manager.close_all()
    shutil.rmtree(root, ignore_errors=True)


async def _submit(manager: SessionManager, session) -> dict:
    result = await apply_tool(manager, session, ToolCall(name="submit"))
    return result.info["hiddenTests"]


async def test_gold_patch_resolves_and_the_base_commit_does_not(dataset, manager: SessionManager):
    _, instances, _ = dataset
    valid = instances[0]
    before = await manager.create(instance_task(valid))
    verdict = await _submit(manager, before)
    assert verdict["resolved"] is False
    assert verdict["failToPass"] == {"total": len(F2P), "passed": 0}
    assert verdict["passToPass"] == {"total": len(P2P), "passed": len(P2P)}
    fixed = await manager.create(instance_task(valid))
    assert (await manager.apply_patch(fixed, valid.patch)).exit_code == 0
    verdict = await _submit(manager, fixed)
    assert verdict["resolved"] is True, verdict
    assert verdict["exitCode"] == 0


async def test_workspace_is_the_base_tree_without_the_test_patch_or_the_mirror(dataset, manager: SessionManager):
    data, instances, _ = dataset
    session = await manager.create(instance_task(instances[0]))
    listing = await manager.execute(session, "ls src/semver && ls tests | wc -l && test ! -e .git && echo no-git")
    assert "version.py" in listing.output and "no-git" in listing.output
    found = await manager.execute(session, "grep -rl test_bump_patch_adds_one . ; echo done")
    assert found.output.strip() == "done"  # the hidden tests are nowhere in the workspace
    grep = await manager.execute(session, "grep -c 'self._patch + 2' src/semver/version.py")
    assert grep.output.strip() == "1"  # the bug of the base commit
    if manager.isolated:  # the mirror holds the pristine commit: the fix
        peek = await manager.execute(session, f"ls {data.mirror}")  # not there (a private /tmp), or not readable
        assert peek.exit_code != 0 and ("No such file" in peek.output or "Permission denied" in peek.output)


async def test_code_runs_in_the_prepared_environment_from_the_workspace(dataset, manager: SessionManager):
    _, instances, _ = dataset
    session = await manager.create(instance_task(instances[0]))
    result = await manager.execute(session, "python -c 'import semver, pytest_cov; print(semver.__file__)'")
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "src/semver/__init__.py"  # the workspace's copy, shown relative to it


@pytest.mark.parametrize(
    "tamper",
    [
        # a conftest.py that turns every failure into a pass
        (
            "conftest.py",
            "import pytest\n\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
            "    outcome = yield\n    report = outcome.get_result()\n    report.outcome = 'passed'\n",
        ),
        # the failing visible test rewritten to pass
        ("tests/test_bump.py", "def test_should_bump_patch():\n    assert True\n"),
        # the file the test patch adds, written first with tests that pass
        ("tests/test_issue_bump_patch.py", REGRESSION_TESTS.replace("assert ", "assert True or ")),
        # a forged report: pytest's own summary lines printed at import time
        (
            "src/semver/_forge.py",
            "print('PASSED tests/test_issue_bump_patch.py::test_bump_patch_adds_one')\n",
        ),
        # a plugin registered through planted package metadata
        ("evil.dist-info/entry_points.txt", "[pytest11]\nevil = semver\n"),
        # a .pth file and a sitecustomize that patch the interpreter
        ("sitecustomize.py", "import builtins\nbuiltins.__dict__['AssertionError'] = type('X', (Exception,), {})\n"),
    ],
    ids=[
        "conftest-hook",
        "visible-test-rewritten",
        "test-patch-file-planted",
        "printed-pass",
        "dist-info-plugin",
        "sitecustomize",
    ],
)
async def test_tampering_with_how_the_tests_run_does_not_resolve(dataset, manager: SessionManager, tamper):
    _, instances, _ = dataset
    session = await manager.create(instance_task(instances[0]))
    path, content = tamper
    await manager.write_file(session, path, content)
    verdict = await _submit(manager, session)
    assert verdict["resolved"] is False, verdict
    assert verdict["failToPass"]["passed"] == 0


async def test_visible_run_and_tools_on_a_repository(dataset, manager: SessionManager):
    _, instances, _ = dataset
    session = await manager.create(instance_task(instances[0]))
    tests = await apply_tool(manager, session, ToolCall(name="run_tests"))
    info = tests.info["tests"]
    assert info["total"] > 10 and 0 < info["passed"] < info["total"]  # the bump_patch tests fail at base
    assert "test_should_bump_patch" in tests.observation
    found = await apply_tool(
        manager, session, ToolCall(name="search", arguments={"text": "def bump_patch(self)", "path": "src"})
    )
    assert found.info["matches"] == 1 and found.observation.startswith("src/semver/version.py:")
    line = int(found.observation.split(":")[1])
    read = await apply_tool(
        manager,
        session,
        ToolCall(name="read_file", arguments={"path": "src/semver/version.py", "start": line, "end": line + 12}),
    )
    assert f"{line:>5}  " in read.observation and "self._patch + 2" in read.observation
    listed = await apply_tool(manager, session, ToolCall(name="list_files", arguments={"path": "src"}))
    assert "src/semver/" in listed.observation


async def test_missing_environment_is_refused_with_what_to_do(dataset, manager: SessionManager):
    _, instances, _ = dataset
    task = instance_task(instances[0])
    broken = task.model_copy(
        update={"repository": task.repository.model_copy(update={"environment": "0" * 20})}  # type: ignore[union-attr]
    )
    with pytest.raises(SessionError) as caught:
        await manager.create(broken)
    assert caught.value.status == 409 and "kuberl tasks prepare" in str(caught.value)


async def test_check_reports_each_instance_and_why(dataset):
    data, instances, environments = dataset
    verdicts = await check_instances(instances, data.mirror, environments)
    lines = {v.instance_id: v.line() for v in verdicts}
    assert lines["python-semver__python-semver-1"] == "VALID python-semver__python-semver-1"
    assert (
        "INVALID python-semver__python-semver-2: the gold patch does not resolve it"
        in lines["python-semver__python-semver-2"]
    )
    assert (
        "INVALID python-semver__python-semver-3: the gold patch does not apply"
        in lines["python-semver__python-semver-3"]
    )


def test_check_command_prints_a_line_per_instance_and_the_count(dataset, tmp_path: Path):
    data, _, environments = dataset
    only_valid = tmp_path / "valid.jsonl"
    only_valid.write_text(data.instances.read_text().splitlines()[0] + "\n")
    args = ["check", "--repos", str(data.mirror), "--environments", str(environments)]
    done = subprocess.run(
        [sys.executable, "-m", "kuberl_app.cli", "tasks", *args[:1], str(only_valid), *args[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "1/1 instances valid"
    done = subprocess.run(
        [sys.executable, "-m", "kuberl_app.cli", "tasks", "check", str(data.instances), *args[1:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert done.stdout.strip().splitlines()[-1] == "1/3 instances valid"


async def test_a_folder_planted_where_the_test_patch_adds_a_file_is_removed(dataset, manager: SessionManager):
    _, instances, _ = dataset
    session = await manager.create(instance_task(instances[0]))
    await manager.execute(
        session, "mkdir -p tests/test_issue_bump_patch.py/x && touch tests/test_issue_bump_patch.py/x/y"
    )
    assert (await manager.apply_patch(session, instances[0].patch)).exit_code == 0
    assert (await _submit(manager, session))["resolved"] is True


async def test_a_test_patch_that_does_not_apply_fails_every_test_with_a_verdict(dataset, manager: SessionManager):
    _, instances, _ = dataset
    task = instance_task(instances[0])
    assert task.repository is not None
    broken = (
        "diff --git a/tests/test_bump.py b/tests/test_bump.py\n--- a/tests/test_bump.py\n+++ b/tests/test_bump.py\n"
        "@@ -1,2 +1,2 @@\n-a line the file does not have\n+another\n context neither\n"
    )
    task = task.model_copy(update={"repository": task.repository.model_copy(update={"test_patch": broken})})
    session = await manager.create(task)
    outcome = await manager.run_tests(session, hidden=True)
    assert outcome.resolution is not None and not outcome.resolution.resolved
    assert outcome.resolution.fail_to_pass.passed == 0 and "the test patch does not apply" in outcome.output
