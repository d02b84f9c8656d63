"""Inside a task's own image, beside the portable sandbox server: one authenticated call to it, printed as JSON
(`{"status": ..., "body": ...}`). Standard library only (it runs under the image's Python).

    python3 foreign_client.py METHOD PATH [JSON-BODY] [--no-token]
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request

URL = "http://127.0.0.1:8700"


def call(method: str, path: str, body: object | None, token: str | None) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(URL + path, method=method, data=data)
    request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"{}")


def wait_ready(deadline: float) -> None:
    while True:
        try:
            if call("GET", "/healthz", None, None)[0] == 200:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the sandbox server did not answer /healthz")
        time.sleep(0.2)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--no-token"]
    token = None if "--no-token" in sys.argv else os.environ["KUBERL_SANDBOX_TOKEN"]
    wait_ready(time.monotonic() + 60)
    status, answer = call(args[0], args[1], json.loads(args[2]) if len(args) > 2 else None, token)
    print(json.dumps({"status": status, "body": answer}))
