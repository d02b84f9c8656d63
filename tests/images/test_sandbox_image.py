"""The sandbox image's own entry point, under podman with exactly the rights the operator gives a sandbox pod
(kuberl_operator.security: six capabilities, no privilege escalation, read-only root filesystem, an unmasked
/proc), serves an authenticated session whose command runs as an unprivileged uid of its own."""

from __future__ import annotations

import json
import secrets
import subprocess
import time

import pytest
from conftest import REPO
from helpers.built_images import PODMAN, built_image, can_build, image_config, ulimits

from kuberl_operator.security import SANDBOX_CAPABILITIES

pytestmark = pytest.mark.slow

CLIENT = REPO / "tests/images/sandbox_client.py"
# What runc needs beyond the pod's capabilities: its default masked /proc paths make the kernel refuse each
# command's private /proc (a pod gets the same with `procMount: Unmasked`). Its default seccomp filter is fine.
PROC = ("--security-opt", "unmask=ALL")


@pytest.fixture(scope="module")
def sandbox_image() -> str:
    if reason := can_build():
        pytest.skip(reason)
    return built_image("sandbox")


@pytest.fixture(scope="module")
def server(sandbox_image):
    """A running container of the image (its ENTRYPOINT), with the pod's rights, and its token."""
    name, token = f"kuberl-image-test-{secrets.token_hex(4)}", secrets.token_hex(16)
    caps = ",".join(sorted(SANDBOX_CAPABILITIES))
    subprocess.run(
        [
            *PODMAN, "run", "--detach", "--name", name, "--network", "none", *ulimits(), "--read-only",
            "--cap-drop", "ALL", "--cap-add", caps, "--security-opt", "no-new-privileges", *PROC,
            "--env", f"KUBERL_SANDBOX_TOKEN={token}", "--volume", f"{CLIENT}:/opt/test/client.py:ro", sandbox_image,
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    try:
        yield name, token
    finally:
        subprocess.run([*PODMAN, "rm", "--force", "--time", "2", name], capture_output=True)


def test_the_server_runs_as_root_by_design(sandbox_image):
    config = image_config(sandbox_image)
    assert config.get("User", "") in ("", "0", "root")  # a supervisor that gives each session its own uid
    assert config["Entrypoint"][:2] == ["kuberl", "sandbox"]


def test_a_session_runs_a_command_as_its_own_unprivileged_user(server):
    name, _ = server
    command = "id -u; cat a.txt; python3 -c 'import sys; print(sys.version_info[:2])'"
    deadline, out = time.monotonic() + 90, None
    while time.monotonic() < deadline:
        out = subprocess.run(
            [*PODMAN, "exec", name, "python3", "/opt/test/client.py", command], capture_output=True, text=True
        )
        if out.returncode == 0 or "is not running" in out.stderr or "improper" in out.stderr:
            break
        time.sleep(1)
    logs = subprocess.run([*PODMAN, "logs", name], capture_output=True, text=True)
    assert out is not None and out.returncode == 0, f"{out.stderr}\nserver log:\n{logs.stdout}{logs.stderr}"
    answer = json.loads(out.stdout)
    assert answer["unauthorized"] == 401  # no token, no session
    assert answer["open"] == 201 and answer["exec"] == 200, answer
    uid, text, version = answer["result"]["output"].splitlines()
    assert answer["result"]["exitCode"] == 0
    assert int(uid) not in (0, 65532) and text == "hi" and version == "(3, 11)"
