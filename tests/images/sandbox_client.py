"""Inside the sandbox image, beside its running server: open a session with the server's token and run one
command in it; prints JSON (the command's result and the session's id). Standard library only."""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

URL = "http://127.0.0.1:8700"


def call(method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(URL + path, method=method, data=json.dumps(body).encode() if body else None)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def wait_ready(deadline: float) -> None:
    while True:
        try:
            if call("GET", "/healthz")[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the sandbox server did not answer /healthz")
        time.sleep(0.2)


def main(command: str) -> dict:
    wait_ready(time.monotonic() + 60)
    token = os.environ["KUBERL_SANDBOX_TOKEN"]
    unauthorized, _ = call("POST", "/v1/sessions", {"task": {"taskId": "t", "prompt": "p", "files": {}}})
    status, opened = call(
        "POST", "/v1/sessions", {"task": {"taskId": "image", "prompt": "p", "files": {"a.txt": "hi\n"}}}, token
    )
    if status != 201:
        return {"unauthorized": unauthorized, "open": status, "answer": opened}
    sid = opened["sessionId"]
    status, result = call("POST", f"/v1/sessions/{sid}/exec", {"command": command, "timeout": 30}, token)
    return {"unauthorized": unauthorized, "open": 201, "exec": status, "result": result}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
