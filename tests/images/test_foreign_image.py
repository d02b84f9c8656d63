"""The sandbox server in a task's own image (a SWE-bench-style instance image without KubeRL), as a sandbox pod
runs it: an init container of the sandbox image copies the portable bundle onto a shared volume
(`install_argv`), then the instance image runs the bundled server (`server_argv`, `server_env`) with exactly the
rights of a sandbox pod (six capabilities, no privilege escalation, read-only root, an unmasked /proc). A
repository task's session works on a copy of /testbed as its own uid with only its loopback; the gold fix
resolves, nothing does not; an image without a shell is refused in one line."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import REPO
from helpers.built_images import PODMAN, built_image, can_build, missing_tools, ulimits
from helpers.instance_images import instance_image, instance_rows, shellless_image

from kuberl import portable_server
from kuberl.api import env_vars
from kuberl.swebench.instances import SWEBenchInstance, instance_task
from kuberl_operator.security import SANDBOX_CAPABILITIES

pytestmark = pytest.mark.slow

CLIENT = REPO / "tests/images/foreign_client.py"
RIGHTS = (
    "--read-only", "--cap-drop", "ALL", "--cap-add", ",".join(sorted(SANDBOX_CAPABILITIES)),
    "--security-opt", "no-new-privileges", "--security-opt", "unmask=ALL",
)  # fmt: skip
SERVER_ARGS = ["--host", "127.0.0.1", "--port", "8700"]


@pytest.fixture(scope="module")
def bundle():
    """The volume an init container of the sandbox image filled with the bundle (install_argv)."""
    if reason := can_build() or (missing_tools() and "image tools missing"):
        pytest.skip(reason)
    sandbox = built_image("sandbox")
    folder = Path(tempfile.mkdtemp(prefix="kuberl-bundle-", dir="/var/tmp"))
    folder.chmod(0o777)  # an emptyDir: root's, 0777; the operator's installer runs as a non-root uid
    command, *args = portable_server.install_argv()
    volume = f"{folder}:{portable_server.PORTABLE_MOUNT}"
    installer = [*PODMAN, "run", "--rm", "--network", "none", *ulimits(), "--user", "65532:65532", "--cap-drop", "ALL"]
    done = subprocess.run(
        [*installer, "--volume", volume, "--entrypoint", command, sandbox, *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def _run_server(image: str, bundle: Path, token: str, *extra: str) -> list[str]:
    env = {**portable_server.server_env(), env_vars.SANDBOX_TOKEN: token, env_vars.SANDBOX_ROOT: "/workspace/sessions"}
    return [
        *PODMAN, "run", "--network", "none", *ulimits(), *RIGHTS, *extra,
        "--volume", f"{bundle}:{portable_server.PORTABLE_MOUNT}:ro", "--volume", "/workspace",
        *[f"--env={k}={v}" for k, v in env.items()],
        image, *portable_server.server_argv(SERVER_ARGS),
    ]  # fmt: skip


class Server:
    """A running instance-image container with the portable server, called through the image's own Python."""

    def __init__(self, name: str) -> None:
        self.name = name

    def call(self, method: str, path: str, body: object | None = None, token: bool = True) -> tuple[int, dict]:
        # the image's python3, without the server's PYTHONHOME/PYTHONPATH (podman exec inherits the container's env)
        command = [*PODMAN, "exec", self.name, "env", "-u", "PYTHONHOME", "-u", "PYTHONPATH", "python3"]
        command += ["/opt/test/client.py", method, path, *([json.dumps(body)] if body is not None else [])]
        command += [] if token else ["--no-token"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{done.stderr}\nserver log:\n{self.logs()}"
        answer = json.loads(done.stdout)
        return answer["status"], answer["body"]

    def logs(self) -> str:
        done = subprocess.run([*PODMAN, "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr


@pytest.fixture(scope="module", params=["semver", "inflection"])
def server(request, bundle):
    image, token = instance_image(request.param), secrets.token_hex(16)
    name = f"kuberl-foreign-{request.param}-{secrets.token_hex(4)}"
    command = _run_server(
        image, bundle, token, "--detach", "--name", name, "--volume", f"{CLIENT}:/opt/test/client.py:ro"
    )
    started = subprocess.run(command, capture_output=True, text=True)
    assert started.returncode == 0, started.stderr
    try:
        yield request.param, Server(name)
    finally:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "2", name], capture_output=True)


@pytest.fixture(scope="module")
def rows(bundle):
    return instance_rows()


@pytest.fixture(scope="module")
def task(server, rows):
    (row,) = [r for r in rows if r["repo"].endswith(server[0])]
    task = instance_task(SWEBenchInstance.model_validate(row))
    assert task.repository is not None and task.repository.workdir == "/testbed"
    return {"row": row, "task": task.model_dump(by_alias=True, exclude_none=True, mode="json")}


def _open(server: Server, task: dict) -> str:
    status, opened = server.call("POST", "/v1/sessions", {"task": task["task"]})
    assert status == 201, f"{opened}\n{server.logs()}"
    return opened["sessionId"]


def _submit(server: Server, sid: str) -> dict:
    status, result = server.call("POST", f"/v1/sessions/{sid}/tests", {"hidden": True})
    assert status == 200, result
    return result


def test_a_session_on_the_images_repository_runs_as_its_own_uid_with_only_loopback(server, task):
    _, srv = server
    assert srv.call("POST", "/v1/sessions", {"task": task["task"]}, token=False)[0] == 401
    sid = _open(srv, task)
    command = (
        "id -u; stat -c %u .; ls /sys/class/net | xargs; test -d .git && echo history; ls -A /kuberl/python | wc -l"
    )
    status, result = srv.call("POST", f"/v1/sessions/{sid}/exec", {"command": command, "timeout": 30})
    assert status == 200 and result["exitCode"] == 0, result
    uid, owner, interfaces, history, bundled = result["output"].splitlines()
    assert int(uid) not in (0, 65532) and owner == uid  # the workspace copy is the session's own
    assert interfaces == "lo" and history == "history"
    assert bundled == "0"  # the server's interpreter and packages are covered


def test_commands_use_the_images_python_and_the_workspace_copy(server, task):
    name, srv = server
    sid = _open(srv, task)
    command = f"python -c 'import sys, {name}; print(sys.prefix); print({name}.__file__)'"
    status, result = srv.call("POST", f"/v1/sessions/{sid}/exec", {"command": command, "timeout": 30})
    assert status == 200 and result["exitCode"] == 0, result
    prefix, module = result["output"].split()
    assert prefix == "/opt/venv" and not module.startswith("/testbed")  # the session's copy, not the image's


def test_the_gold_fix_resolves_and_nothing_does_not(server, task):
    _, srv = server
    untouched = _submit(srv, _open(srv, task))
    assert untouched["resolved"] is False and untouched["failToPass"]["passed"] == 0, untouched
    assert untouched["passToPass"]["passed"] == untouched["passToPass"]["total"] > 0, untouched
    fixed = _open(srv, task)
    status, applied = srv.call("POST", f"/v1/sessions/{fixed}/files/patch", {"patch": task["row"]["patch"]})
    assert status == 200 and applied["exitCode"] == 0, applied
    verdict = _submit(srv, fixed)
    assert verdict["resolved"] is True, verdict


def test_an_image_without_a_shell_is_refused_in_one_line(bundle, tmp_path):
    log = tmp_path / "termination-log"
    log.write_text("")
    command = _run_server(shellless_image(), bundle, "t", "--rm", "--volume", f"{log}:/dev/termination-log")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("sandbox:")]
    assert len(lines) == 1 and "/bin/sh" in lines[0] and "POSIX shell" in lines[0], done.stderr
    assert log.read_text() == lines[0]
