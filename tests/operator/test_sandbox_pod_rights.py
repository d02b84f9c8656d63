"""The sandbox server works with exactly the rights the operator's sandbox pod gives it: a real `kuberl sandbox`
as root limited to the rendered capabilities (`setpriv --bounding-set`), and once more inside a user namespace
that maps 65536 ids, like the kubelet's for `hostUsers: false`. A capability the server needs and the pod lacks
shows up here as a failed request or a leftover, not first on a cluster. Needs root (skipped otherwise)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import EXAMPLES

from kuberl.validation import load_rljob
from kuberl_operator.sandbox import build_sandbox_deployment
from kuberl_operator.security import SandboxPodSecurity
from kuberl_sandbox.local import local_sandbox

SETPRIV = shutil.which("setpriv")
pytestmark = pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None, reason="needs root and util-linux setpriv")

# The kubelet maps 65536 ids to a hostUsers: false pod. Root stays the host's here, so that the server can
# read this machine's interpreter under /root; its capabilities still belong to the namespace.
POD_ID_MAP = "0 0 1\n1 100001 65535"
# Joins a fresh user namespace with the map given, then execs the command (a process cannot write the map
# of its own new namespace, so a child holds one open while this process writes it and joins).
ENTER_USER_NAMESPACE = """
import ctypes, os, signal, sys
CLONE_NEWUSER = 0x10000000
libc = ctypes.CDLL(None, use_errno=True)
ready, told = os.pipe()
child = os.fork()
if child == 0:
    os._exit(1) if libc.unshare(CLONE_NEWUSER) else os.write(told, b"x")
    signal.pause()
os.read(ready, 1)
for name, text in (("setgroups", "allow"), ("uid_map", sys.argv[1]), ("gid_map", sys.argv[1])):
    with open(f"/proc/{child}/{name}", "w") as f:
        f.write(text)
if libc.setns(os.open(f"/proc/{child}/ns/user", os.O_RDONLY), CLONE_NEWUSER):
    raise OSError(ctypes.get_errno(), "setns")
os.kill(child, signal.SIGKILL)
os.execvp(sys.argv[2], sys.argv[2:])
"""

TASK = {
    "taskId": "rights",
    "prompt": "p",
    "files": {
        "app.py": "X = 1\n",
        "test_app.py": "import unittest\n\nimport app\n\n\nclass T(unittest.TestCase):\n"
        "    def test_x(self):\n        self.assertEqual(app.X, 1)\n",
    },
    "hiddenTests": {
        "test_hidden.py": "import unittest\n\nimport app\n\n\nclass H(unittest.TestCase):\n"
        "    def test_x(self):\n        self.assertEqual(app.X, 1)\n"
    },
    "testCommand": "python -m unittest -q",
}
# What a session may leave for the server to clean up: folders it made unreadable, sticky folders of its
# own with files in them, in the workspace and in each private temporary folder.
LITTER = (
    "for d in . /tmp /var/tmp /dev/shm; do mkdir -p $d/s/t && echo x > $d/s/t/f && echo y > $d/s/g"
    " && chmod 1777 $d/s && chmod 0 $d/s/t; done"
)


def rendered_capabilities() -> list[str]:
    job = load_rljob(str(next(p for p in EXAMPLES if p.stem == "swe-toy")))
    deployment = build_sandbox_deployment(job, "ns", None, "token", SandboxPodSecurity())
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    capabilities = container["securityContext"]["capabilities"]
    assert capabilities["drop"] == ["ALL"]
    return capabilities["add"]


@contextmanager
def sandbox_server(capabilities: list[str], user_namespace: bool) -> Iterator[tuple[httpx.Client, Path]]:
    """`kuberl sandbox` as root with only `capabilities`, optionally in a pod-like user namespace."""
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in capabilities)])
    launcher = [SETPRIV, f"--bounding-set={bounding}", "--inh-caps=-all"]
    if user_namespace:
        launcher = [sys.executable, "-c", ENTER_USER_NAMESPACE, POD_ID_MAP, *launcher]
    with local_sandbox(ready_timeout=60, launcher=launcher) as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=60) as client:
            yield client, server.root


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, f"{response.request.method} {response.request.url.path}: {response.text}"
    return response.json() if response.content else None


def session_leftovers(sessions: Path) -> list[str]:
    return [
        str(p.relative_to(sessions))
        for p in sessions.rglob("*")
        if not p.relative_to(sessions).parts[0].startswith(".")
    ]


@pytest.mark.parametrize(
    "user_namespace",
    [False, True],
    ids=["host-users", "pod-user-namespace"],
)
def test_the_server_does_everything_with_the_rendered_capabilities(user_namespace):
    with sandbox_server(rendered_capabilities(), user_namespace) as (http, sessions):
        sid = ok(http.post("/v1/sessions", json={"task": TASK}), 201)["sessionId"]
        run = ok(http.post(f"/v1/sessions/{sid}/exec", json={"command": f"id -u; {LITTER}"}))
        assert run["exitCode"] == 0 and int(run["output"].split()[0]) != 0, run
        overrun = ok(http.post(f"/v1/sessions/{sid}/exec", json={"command": "sleep 60", "timeout": 1}))
        assert overrun["timedOut"] and overrun["exitCode"] is None  # killed: another uid's process (KILL)
        ok(http.post(f"/v1/sessions/{sid}/files", json={"path": "notes/a.txt", "content": "a\n"}))
        assert ok(http.get(f"/v1/sessions/{sid}/files", params={"path": "notes/a.txt"}))["content"] == "a\n"
        assert ok(http.post(f"/v1/sessions/{sid}/files/replace", json={"path": "app.py", "old": "1", "new": "1 "}))
        ok(http.post(f"/v1/sessions/{sid}/tests", json={}))
        assert ok(http.post(f"/v1/sessions/{sid}/tests", json={"hidden": True}))["passed"] == 1
        ok(http.delete(f"/v1/sessions/{sid}"), 204)
        assert session_leftovers(sessions) == [], "the closed session left files behind"
