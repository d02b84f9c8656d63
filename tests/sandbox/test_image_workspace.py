"""Image-workspace mode (KUBERL_SANDBOX_FOREIGN_IMAGE=1) without an image: the task's repository lies in a folder
of this machine as it would at /testbed in a SWE-bench image, and the server's PATH leads to that "image's"
environment. A session's workspace is a copy of the folder (links kept as links, the session's own files), its
commands and the submit-time tests run on that PATH, and SWE-bench's verdict comes from pytest's report."""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from helpers.swe_repos import F2P, P2P, REPO, make_dataset

from kuberl import portable_server
from kuberl.api.environment import ToolCall
from kuberl.swebench.environments import prepare, recipe_for
from kuberl.swebench.instances import instance_task, load_instances
from kuberl_app.one_machine.task_check import sandbox_settings
from kuberl_sandbox import image_workspace
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.session_manager import SessionError, SessionManager, foreign_image_problem
from kuberl_sandbox.tools import apply_tool

pytestmark = pytest.mark.slow


def _reachable_folder(prefix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o711)
    return folder


@pytest.fixture(scope="module")
def image():
    """A stand-in for an instance image: the repository at its base commit (history included, and a link out
    of it) in `testbed`, and a prepared environment whose bin folder plays the image's PATH. Both lie inside the
    sandbox root, the one folder of this machine's /tmp that sessions see (an image has them in its own root)."""
    work = _reachable_folder("kuberl-image-ws-")
    data = make_dataset(work / "data")
    instance = load_instances(data.instances)[0]
    inside = work / "sandbox" / "image"
    inside.mkdir(parents=True)
    os.chmod(work / "sandbox", 0o711)
    os.chmod(inside, 0o755)
    environment = prepare(recipe_for(instance), data.mirror, inside / "environments")
    testbed = inside / "testbed"
    shutil.copytree(data.mirror / REPO.replace("/", "__"), testbed, symlinks=True)
    (testbed / "escape").symlink_to("/etc")
    os.chmod(testbed, 0o755)
    yield work / "sandbox", testbed, instance, environment
    shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
async def manager(image, monkeypatch):
    root, _, _, environment = image
    monkeypatch.setenv("PATH", f"{environment.bin}:/usr/local/bin:/usr/bin:/bin")
    settings = sandbox_settings(root, root / "no-mirror", root / "no-environments")
    settings = dataclasses.replace(settings, foreign_image=True, repos=None, environments=None)
    manager = SessionManager(settings, SandboxMetrics())
    manager.prepare()
    yield manager
    await manager.close_all()


def _task(image, workdir: str | None = None):
    _, testbed, instance, _ = image
    task = instance_task(instance)
    assert task.repository is not None
    repository = task.repository.model_copy(update={"workdir": workdir or str(testbed)})
    return task.model_copy(update={"repository": repository})


async def _submit(manager: SessionManager, session) -> dict:
    result = await apply_tool(manager, session, ToolCall(name="submit"))
    return result.info["hiddenTests"]


async def test_the_workspace_is_a_copy_of_the_workdir_owned_by_the_session(image, manager):
    session = await manager.create(_task(image))
    out = await manager.execute(
        session, "id -u; stat -c %u src/semver/version.py; test -L escape && echo link; "
        "test -d .git && echo history; grep -c 'self._patch + 2' src/semver/version.py",
    )  # fmt: skip
    uid, owner, link, history, bug = out.output.split()
    assert uid == owner
    if manager.isolated:
        assert int(uid) != 0
    assert (link, history, bug) == ("link", "history", "1")  # the link copied as a link; the base commit's bug
    assert (await manager.execute(session, "echo changed >> README.rst && echo ok")).output.strip() == "ok"
    testbed = image[1]
    assert "changed" not in (testbed / "README.rst").read_text()  # the image's folder is untouched


async def test_commands_run_on_the_images_path_with_the_workspace_first(image, manager):
    _, _, _, environment = image
    session = await manager.create(_task(image))
    result = await manager.execute(
        session, "python -c 'import sys, semver, pytest_cov; print(sys.prefix, semver.__file__)'"
    )
    assert result.exit_code == 0, result.output
    prefix, module = result.output.split()
    assert prefix == str(environment.folder / "venv") and module == "src/semver/__init__.py"


async def test_gold_patch_resolves_and_nothing_does_not(image, manager):
    _, _, instance, _ = image
    untouched = await manager.create(_task(image))
    verdict = await _submit(manager, untouched)
    assert verdict["resolved"] is False
    assert verdict["failToPass"] == {"total": len(F2P), "passed": 0}
    assert verdict["passToPass"] == {"total": len(P2P), "passed": len(P2P)}
    fixed = await manager.create(_task(image))
    assert (await manager.apply_patch(fixed, instance.patch)).exit_code == 0
    verdict = await _submit(manager, fixed)
    assert verdict["resolved"] is True, verdict


async def test_a_missing_workdir_refuses_the_session_naming_the_path(image, manager):
    with pytest.raises(SessionError) as caught:
        await manager.create(_task(image, workdir="/nowhere/testbed"))
    assert caught.value.status == 409 and "/nowhere/testbed" in str(caught.value)


def test_the_bundles_interpreter_and_packages_are_covered(manager, monkeypatch):
    # outside /tmp, whose folders sessions never see anyway (a private /tmp)
    bundle = Path(tempfile.mkdtemp(prefix="kuberl-bundle-", dir=Path.home()))
    try:
        (bundle / "python").mkdir()
        (bundle / "bin").mkdir()
        monkeypatch.setattr(portable_server, "PYTHON_HOME", str(bundle / "python"))
        covered = manager._hidden_folders(())
        assert bundle / "python" in covered and bundle / "bin" not in covered  # commands run some of its tools
    finally:
        shutil.rmtree(bundle)


def test_an_image_without_a_shell_is_refused_in_one_line():
    why = image_workspace.shell_problem("/nonexistent/sh")
    assert why is not None and "\n" not in why and "/nonexistent/sh" in why and "POSIX shell" in why
    assert foreign_image_problem() is None  # this machine has /bin/sh and the tools
