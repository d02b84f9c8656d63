"""Bad requests get a 4xx with a message that says what is wrong, never a 500."""

from __future__ import annotations

import time

import httpx
import pytest

TASK = {"taskId": "t", "prompt": "p", "files": {"a.py": "x = 1\n"}}


@pytest.fixture
def http(sandbox):
    with httpx.Client(base_url=sandbox.url, headers={"Authorization": f"Bearer {sandbox.token}"}, timeout=30) as c:
        yield c


@pytest.fixture
def sid(http):
    sid = http.post("/v1/sessions", json={"task": TASK}).json()["sessionId"]
    yield sid
    http.delete(f"/v1/sessions/{sid}")


CASES = [
    ("unknown-session", "GET", "/v1/sessions/nope", None, None, 404, "unknown session 'nope'"),
    ("unknown-session-exec", "POST", "/v1/sessions/nope/exec", {"command": "true"}, None, 404, "unknown session"),
    ("malformed-json", "POST", "/v1/sessions", b"{not json", None, 422, "JSON decode error"),
    ("missing-task", "POST", "/v1/sessions", {}, None, 422, "body.task: Field required"),
    ("missing-task-prompt", "POST", "/v1/sessions", {"task": {"taskId": "x"}}, None, 422, "prompt"),
    (
        "task-path-escape",
        "POST",
        "/v1/sessions",
        {"task": {**TASK, "files": {"../x": ""}}},
        None,
        422,
        "relative path inside the workspace",
    ),
    ("unknown-field", "POST", "/v1/sessions", {"task": TASK, "colour": 1}, None, 422, "colour"),
]


@pytest.mark.parametrize(
    ("case", "method", "path", "body", "params", "status", "words"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_session_requests(http, case, method, path, body, params, status, words):
    kwargs = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    response = http.request(method, path, params=params, **kwargs)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]


SESSION_CASES = [
    ("exec-missing-command", "POST", "/exec", {}, None, 422, "command: Field required"),
    ("exec-empty-command", "POST", "/exec", {"command": ""}, None, 422, "command"),
    ("exec-bad-timeout", "POST", "/exec", {"command": "true", "timeout": -1}, None, 400, "timeout must be in"),
    ("exec-huge-timeout", "POST", "/exec", {"command": "true", "timeout": 1e9}, None, 400, "timeout must be in"),
    ("read-missing-file", "GET", "/files", None, {"path": "nope.py"}, 400, "no such file or folder: nope.py"),
    ("read-without-path", "GET", "/files", None, None, 422, "path"),
    ("write-into-a-dir", "POST", "/files", {"path": ".", "content": "x"}, None, 400, ""),
    (
        "replace-missing-text",
        "POST",
        "/files/replace",
        {"path": "a.py", "old": "zzz", "new": "y"},
        None,
        400,
        "old text not found in a.py",
    ),
    ("patch-garbage", "POST", "/files/patch", {"patch": "this is not a diff"}, None, 400, "patch did not apply"),
    ("list-missing-dir", "GET", "/list", None, {"path": "nowhere"}, 400, "no such file or folder: nowhere"),
    ("step-not-a-tool-call", "POST", "/step", {"tool": "x"}, None, 422, "name"),
]


@pytest.mark.parametrize(
    ("case", "method", "route", "body", "params", "status", "words"), SESSION_CASES, ids=[c[0] for c in SESSION_CASES]
)
def test_bad_requests_on_a_session(http, sid, case, method, route, body, params, status, words):
    response = http.request(method, f"/v1/sessions/{sid}{route}", json=body, params=params)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]


@pytest.mark.parametrize(
    ("call", "words"),
    [
        ({"name": "teleport"}, "unknown tool 'teleport'"),
        ({"name": "read_file"}, "missing or non-string argument(s): path"),
        ({"name": "replace", "arguments": {"path": "a.py", "old": 1, "new": "x"}}, "old"),
        ({"name": "read_file", "arguments": {"path": "../../etc/passwd"}}, "outside the workspace"),
    ],
)
def test_malformed_tool_calls_get_an_error_observation(http, sid, call, words):
    response = http.post(f"/v1/sessions/{sid}/step", json=call)
    assert response.status_code == 200
    result = response.json()
    assert result["observation"].startswith("error:") and words in result["observation"]
    assert result["info"]["error"] and not result["done"]


def test_closing_twice_is_a_404(http):
    sid = http.post("/v1/sessions", json={"task": TASK}).json()["sessionId"]
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    assert http.delete(f"/v1/sessions/{sid}").status_code == 404


def test_no_error_was_a_500(sandbox):
    metrics = httpx.get(sandbox.url + "/metrics").text
    assert 'kuberl_sandbox_errors_total{reason="500"}' not in metrics


def test_idle_sessions_are_closed():
    from kuberl_sandbox.local import local_sandbox

    with local_sandbox(session_timeout="1s") as server:
        headers = {"Authorization": f"Bearer {server.token}"}
        sid = httpx.post(server.url + "/v1/sessions", json={"task": TASK}, headers=headers).json()["sessionId"]
        assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=headers).status_code == 200
        time.sleep(2.5)
        assert httpx.get(f"{server.url}/v1/sessions/{sid}", headers=headers).status_code == 404
        assert "kuberl_sandbox_sessions_expired_total 1.0" in httpx.get(server.url + "/metrics").text
        assert not (server.root / sid).exists()
