"""Hostile commands and requests, each with its expected outcome. Afterwards the server is still up,
nothing of the session is left running, and a bystander session is untouched."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
from helpers.sandbox_http import open_session
from helpers.sandbox_http import run as run_command

TASK = {
    "taskId": "hostile",
    "prompt": "p",
    "files": {"notes.txt": "mine\n", "src/app.py": "print('hi')\n"},
    "hiddenTests": {"hidden_test_app.py": "SECRET_HIDDEN_TEST = 1\n"},
}


@pytest.fixture
def http(sandbox):
    with httpx.Client(base_url=sandbox.url, headers={"Authorization": f"Bearer {sandbox.token}"}, timeout=60) as c:
        yield c


def new_session(http: httpx.Client, files: dict[str, str] | None = None) -> str:
    return open_session(http, {**TASK, "files": files or TASK["files"]})


def run(http: httpx.Client, sid: str, command: str, timeout: float = 5) -> dict:
    return run_command(http, sid, command, timeout)


def processes_of(uid: int) -> list[str]:
    """Processes of `uid` started by its commands: every command runs in a PID namespace of its own. (The
    session's namespace holder runs as its uid too, in the host's PID namespace, until the session closes.)"""
    out = subprocess.run(["ps", "-u", str(uid), "-o", "pid=,stat=,cmd="], capture_output=True, text=True).stdout
    ours = os.readlink("/proc/self/ns/pid")
    return [line for line in out.splitlines() if line.strip() and _pid_namespace(line.split()[0]) != ours]


def _pid_namespace(pid: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None  # gone meanwhile


@pytest.fixture
def victim(http):
    """A bystander session with a secret, checked after every hostile command."""
    sid = new_session(http, {"secret.txt": "victim-secret\n"})
    yield sid
    assert http.get(f"/v1/sessions/{sid}/files", params={"path": "secret.txt"}).json()["content"] == "victim-secret\n"
    assert run(http, sid, "echo alive")["output"] == "alive\n"
    http.delete(f"/v1/sessions/{sid}")


def session_uid(http: httpx.Client, sid: str) -> int:
    return int(run(http, sid, "id -u")["output"])


# (case, command, what must hold of the result)
HOSTILE = [
    (
        "write-outside-workspace",
        "echo x > /etc/kuberl-pwned; echo x > /kuberl-pwned; echo rc=$?",
        lambda r: "Permission denied" in r["output"] and "rc=2" in r["output"],
    ),
    (
        "read-hidden-tests",
        "cat ../hidden/*; ls ..",
        lambda r: "SECRET_HIDDEN_TEST" not in r["output"] and "Permission denied" in r["output"],
    ),
    ("read-server-environment", "env; cat /proc/1/environ", lambda r: "KUBERL_SANDBOX_TOKEN" not in r["output"]),
    # the bomb has a second to fill the process limit (bash's `read -t` on a FIFO waits without a fork); then
    # the shell's builtin `echo` (a full limit may have no slot for a fork yet: dash would fail the command)
    (
        "fork-bomb",
        "mkfifo idle; bash -c ':(){ :|:& };:; read -t 1 <> idle'; echo survived",
        lambda r: "survived" in r["output"],
    ),
    (
        "memory-bomb",
        "python -c 'x = bytearray(8 << 30)'",
        lambda r: "MemoryError" in r["output"] and r["exitCode"] == 1,
    ),
    ("infinite-loop", "while :; do :; done", lambda r: r["timedOut"] and r["exitCode"] is None and r["durationS"] < 5),
    (
        "gigabytes-of-output",
        "yes kuberl | head -c 4000000000",
        lambda r: r["truncated"] and len(r["output"]) <= 64 * 1024 and r["durationS"] < 5,
    ),
    (
        "ignores-sigterm",
        "trap '' TERM INT HUP; while :; do sleep 0.1; done",
        lambda r: r["timedOut"] and r["durationS"] < 5,
    ),
    (
        "background-process",
        "sleep 300 & echo started",
        lambda r: r["exitCode"] == 0 and "started" in r["output"] and r["durationS"] < 2,
    ),
    (
        "daemon-escapes-group",
        "setsid sh -c 'sleep 300' & nohup sleep 300 >/dev/null 2>&1 & echo started",
        lambda r: r["exitCode"] == 0 and r["durationS"] < 2,
    ),
    (
        "huge-file",
        "head -c 200000000 /dev/zero > big; ls -l big | cut -d' ' -f5",
        lambda r: int(r["output"].split()[-1]) <= 64 << 20,
    ),
    ("cpu-time", "python -c 'while True: pass'", lambda r: r["timedOut"] or r["exitCode"] is None),
]


COMMAND_TIMEOUT_S = {"fork-bomb": 20}
"""A fork bomb's survivors retry their forks with back-off until the process limit turns them away: the
server's kill of the session's processes may wait on that on a loaded machine."""


@pytest.mark.parametrize(("case", "command", "holds"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_command_is_contained(http, victim, case, command, holds):
    sid = new_session(http)
    uid = session_uid(http, sid)
    result = run(http, sid, command, timeout=COMMAND_TIMEOUT_S.get(case, 3))
    assert holds(result), result
    assert processes_of(uid) == [], "processes outlived the command"
    assert run(http, sid, "cat notes.txt")["output"] == "mine\n"  # the session still works
    http.delete(f"/v1/sessions/{sid}")


def test_another_sessions_workspace_is_unreadable(sandbox, http, victim):
    sid = new_session(http)
    victim_home = f"{sandbox.root}/{victim}/work"
    result = run(http, sid, f"cat {victim_home}/secret.txt; ls {victim_home}")
    assert "victim-secret" not in result["output"] and "Permission denied" in result["output"]
    assert session_uid(http, sid) != session_uid(http, victim)


LINK_ESCAPES = [
    ("read", "get", "/files", {"path": "escape"}, None),
    ("read-through-dir-link", "get", "/files", {"path": "etc/passwd"}, None),
    ("write", "post", "/files", None, {"path": "escape", "content": "pwned"}),
    ("write-through-dir-link", "post", "/files", None, {"path": "etc/kuberl", "content": "pwned"}),
    ("replace", "post", "/files/replace", None, {"path": "escape", "old": "root", "new": "pwned"}),
    ("list", "get", "/list", {"path": "etc"}, None),
    ("traversal-read", "get", "/files", {"path": "../hidden/hidden_test_app.py"}, None),
    ("traversal-write", "post", "/files", None, {"path": "src/../../x", "content": "pwned"}),
    ("absolute-read", "get", "/files", {"path": "/etc/passwd"}, None),
]


@pytest.mark.parametrize(("case", "method", "route", "params", "body"), LINK_ESCAPES, ids=[c[0] for c in LINK_ESCAPES])
def test_file_apis_refuse_links_and_traversal_out_of_the_workspace(http, case, method, route, params, body):
    sid = new_session(http)
    run(http, sid, "ln -s /etc/passwd escape; ln -s /etc etc")
    response = http.request(method.upper(), f"/v1/sessions/{sid}{route}", params=params, json=body)
    assert response.status_code == 400, response.text
    detail = response.json()["detail"]
    assert any(words in detail for words in ("outside the workspace", "relative", "do not follow links")), detail
    with open("/etc/passwd") as f:
        assert "pwned" not in f.read()


def test_patch_cannot_write_through_a_link(http):
    sid = new_session(http)
    run(http, sid, "ln -s /etc/hostname hostfile")
    diff = "--- a/hostfile\n+++ b/hostfile\n@@ -1 +1 @@\n-x\n+pwned\n"
    response = http.post(f"/v1/sessions/{sid}/files/patch", json={"patch": diff})
    assert response.status_code == 400
    with open("/etc/hostname") as f:
        assert "pwned" not in f.read()


def test_a_huge_request_body_gets_413(http):
    sid = new_session(http)
    response = http.post(f"/v1/sessions/{sid}/files", json={"path": "big.txt", "content": "x" * (17 << 20)})
    assert response.status_code == 413
    assert "larger than" in response.json()["detail"]


@pytest.mark.parametrize("header", [None, "Bearer wrong-token", "Basic dXNlcjpwYXNz", "Bearer", "bearer  x"])
def test_requests_without_the_right_token_get_401(sandbox, header):
    headers = {"Authorization": header} if header else {}
    response = httpx.post(sandbox.url + "/v1/sessions", json={"task": TASK}, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert httpx.get(sandbox.url + "/v1/sessions/any", headers=headers).status_code == 401


def test_the_server_is_still_healthy(sandbox):
    assert httpx.get(sandbox.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(sandbox.url + "/readyz").status_code == 200


def test_outputs_show_paths_relative_to_the_workspace(http):
    sid = new_session(http)
    assert run(http, sid, "pwd; ls $PWD/src")["output"] == ".\napp.py\n"
