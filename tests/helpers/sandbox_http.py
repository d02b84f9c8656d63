"""A test's calls to a real sandbox server: a client with its token, a session, a command."""

from __future__ import annotations

from typing import Any

import httpx

from kuberl_sandbox.local import SandboxEndpoint


def client(server: SandboxEndpoint) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60)


def open_session(http: httpx.Client, task: dict[str, Any]) -> str:
    response = http.post("/v1/sessions", json={"task": task})
    assert response.status_code == 201, response.text
    return response.json()["sessionId"]


def run(http: httpx.Client, sid: str, command: str, timeout: float = 10) -> dict:
    response = http.post(f"/v1/sessions/{sid}/exec", json={"command": command, "timeout": timeout})
    assert response.status_code == 200, response.text
    return response.json()
