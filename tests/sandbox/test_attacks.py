"""The attack battery's file-layer escapes, each replayed against a real root server.

"Agent" attacks use only an episode's own tool calls and commands; "caller" attacks hold the token and send
concurrent requests or crafted snapshots. Each test failed on the server as it was before the file layer ran
with the session's file rights and O_NOFOLLOW walks (rows 1, 2, 6, 7 deterministically; 3 and 4 are races,
which the session lock now rules out and `test_file_tools_wait_for_the_running_command` checks directly).
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import stat
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from kuberl_sandbox.snapshots import seal, snapshot_key

TASK = {
    "taskId": "attacked",
    "prompt": "p",
    "files": {"module.py": "def f():\n    return 1\n", "test_module.py": "import unittest\n"},
    "hiddenTests": {"hidden_test_module.py": "import unittest\n"},
}
FAST = 10.0
"""Seconds any of these requests may take: a hung server fails the test instead of hanging it."""


@pytest.fixture
def http(sandbox):
    headers = {"Authorization": f"Bearer {sandbox.token}"}
    with httpx.Client(base_url=sandbox.url, headers=headers, timeout=FAST) as client:
        yield client


@pytest.fixture
def sid(http):
    response = http.post("/v1/sessions", json={"task": TASK})
    assert response.status_code == 201, response.text
    session = response.json()["sessionId"]
    yield session
    http.delete(f"/v1/sessions/{session}")


def run(http: httpx.Client, sid: str, command: str, timeout: float = 5) -> dict:
    response = http.post(f"/v1/sessions/{sid}/exec", json={"command": command, "timeout": timeout})
    assert response.status_code == 200, response.text
    return response.json()


def step(http: httpx.Client, sid: str, name: str, **arguments: str) -> dict:
    response = http.post(f"/v1/sessions/{sid}/step", json={"name": name, "arguments": arguments})
    assert response.status_code == 200, response.text
    return response.json()


def still_serving(http: httpx.Client, sid: str) -> None:
    """The server answers, and the session's snapshot, description and listing all work."""
    assert http.get("/healthz").status_code == 200
    for method, route in (("GET", ""), ("GET", "/list"), ("POST", "/snapshot")):
        response = http.request(method, f"/v1/sessions/{sid}{route}")
        assert response.status_code == 200, (route, response.text)


# ------------------------------------------------------------------------------------ 1: FIFOs
def test_a_fifo_neither_hangs_the_server_nor_breaks_the_session(http, sid):
    run(http, sid, "mkfifo notes.fifo")
    started = time.monotonic()
    observation = step(http, sid, "write_file", path="notes.fifo", content="x")["observation"]
    assert observation.startswith("error:") and "not a regular file" in observation
    assert step(http, sid, "read_file", path="notes.fifo")["observation"].startswith("error:")
    assert step(http, sid, "replace", path="notes.fifo", old="a", new="b")["observation"].startswith("error:")
    assert http.get(f"/v1/sessions/{sid}/files", params={"path": "notes.fifo"}).status_code == 400
    assert http.post(f"/v1/sessions/{sid}/files", json={"path": "notes.fifo", "content": "x"}).status_code == 400
    assert time.monotonic() - started < FAST
    still_serving(http, sid)
    submitted = step(http, sid, "submit")
    assert submitted["done"] and "hidden tests passed" in submitted["observation"]


# ---------------------------------------------------------------------------------- 2: snapshots
def sealed_snapshot(token: str, task_id: str, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> dict:
    """A snapshot a caller crafted, sealed with the job's key (the worst case: a caller that holds the token)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for info, content in members:
            if content is not None:
                info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if content is not None else None)
    data = base64.b64encode(buffer.getvalue()).decode()
    checksum = "0" * 64
    mac = seal(snapshot_key(token), task_id, checksum, data)
    return {"sessionId": "x", "taskId": task_id, "checksum": checksum, "data": data, "mac": mac, "actions": []}


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def path_max_chain(target: str) -> list[tuple[tarfile.TarInfo, bytes | None]]:
    """The CVE-2025-4517 archive: folders of 247-character names linked by one-letter links, so the chain's
    resolved length passes PATH_MAX, where `os.path.realpath` (which the "data" filter trusts) stops
    resolving; a final link then points `../` out, and a file is written through it."""
    long_name, steps, path, members = "d" * 247, "abcdefghijklmnop", "", []
    for letter in steps:
        members.append((member(os.path.join(path, long_name), tarfile.DIRTYPE), None))
        members.append((member(os.path.join(path, letter), tarfile.SYMTYPE, long_name), None))
        path = os.path.join(path, long_name)
    link_path = os.path.join("/".join(steps), "l" * 254)
    members.append((member(link_path, tarfile.SYMTYPE, "../" * len(steps)), None))
    members.append((member("escape", tarfile.SYMTYPE, link_path + "/" + "../" * 6 + target.lstrip("/")), None))
    members.append((member("escape/pwned", tarfile.REGTYPE), b"written outside\n"))
    return members


@pytest.mark.parametrize(
    "case",
    ["path-max-link-chain", "file-through-a-link", "hard-link", "fifo", "device", "absolute", "dot-dot", "link-out"],
)
def test_a_crafted_snapshot_writes_nothing_outside_the_workspace(http, sandbox, tmp_path, case):
    outside = tmp_path / "outside"
    outside.mkdir()
    members = {
        "path-max-link-chain": lambda: path_max_chain(str(outside)),
        "file-through-a-link": lambda: [
            (member("inside", tarfile.SYMTYPE, "."), None),
            (member("inside/pwned"), b"x"),
        ],
        "hard-link": lambda: [(member("module.py"), b"x"), (member("h", tarfile.LNKTYPE, "module.py"), None)],
        "fifo": lambda: [(member("pipe", tarfile.FIFOTYPE), None)],
        "device": lambda: [(member("dev", tarfile.CHRTYPE), None)],
        "absolute": lambda: [(member(f"{outside}/pwned"), b"x")],
        "dot-dot": lambda: [(member("../../pwned"), b"x")],
        "link-out": lambda: [(member("shadow", tarfile.SYMTYPE, "/etc/shadow"), None)],
    }[case]()
    snapshot = sealed_snapshot(sandbox.token, TASK["taskId"], members)
    started = time.monotonic()
    response = http.post("/v1/sessions/restore", json={"task": TASK, "snapshot": snapshot})
    assert response.status_code == 400, response.text
    assert time.monotonic() - started < FAST
    assert list(outside.iterdir()) == []
    assert not Path(sandbox.root).parent.joinpath("pwned").exists()
    leftovers = [p for p in Path(sandbox.root).rglob("pwned")]
    assert leftovers == [], "a refused restore left files behind"


def test_a_snapshot_restores_what_the_agent_made_with_odd_names(http, sandbox, sid):
    """Names that are not UTF-8, links inside, modes: restored as they were, checksum and all."""
    run(http, sid, "touch \"$(printf 'bad\\377name')\"; ln -s module.py alias.py; chmod 755 module.py; mkdir -p a/b")
    still_serving(http, sid)
    snapshot = http.post(f"/v1/sessions/{sid}/snapshot").json()
    restored = http.post("/v1/sessions/restore", json={"task": TASK, "snapshot": snapshot})
    assert restored.status_code == 201, restored.text
    rid = restored.json()["sessionId"]
    assert http.get(f"/v1/sessions/{rid}").json()["checksum"] == snapshot["checksum"]
    listed = {e["path"]: e["type"] for e in http.get(f"/v1/sessions/{rid}/list").json()["entries"]}
    assert listed["bad\\xffname"] == "file" and listed["alias.py"] == "link" and listed["a/b"] == "dir"
    http.delete(f"/v1/sessions/{rid}")


# ---------------------------------------------------------------------------- 3, 4, 5: races, chown
def test_file_tools_wait_for_the_running_command(http, sid):
    """File endpoints and `/step` file tools hold the session's lock: nothing a command does can race them."""
    with ThreadPoolExecutor(2) as pool:
        command = pool.submit(run, http, sid, "sleep 1.5; echo done")
        time.sleep(0.3)
        started = time.monotonic()
        for call in (
            lambda: http.get(f"/v1/sessions/{sid}/files", params={"path": "module.py"}),
            lambda: http.post(f"/v1/sessions/{sid}/step", json={"name": "read_file", "arguments": {"path": "x"}}),
        ):
            assert call().status_code in (200, 400)
        waited = time.monotonic() - started
        assert command.result()["output"] == "done\n"
    assert waited > 0.8, f"a file call ran beside a command ({waited:.2f}s)"


def test_swapping_a_file_for_a_link_to_the_server_environment_leaks_nothing(http, sandbox, sid):
    """Row 3: a command swaps a file for a link to /proc/self/environ while the caller reads it, repeatedly."""
    swapper = "for i in $(seq 300); do echo x > f.tmp; mv -f f.tmp f; ln -sf /proc/self/environ f; done"

    async def scenario() -> list[str]:
        headers = {"Authorization": f"Bearer {sandbox.token}"}
        async with httpx.AsyncClient(base_url=sandbox.url, headers=headers, timeout=30) as client:
            command = asyncio.create_task(
                client.post(f"/v1/sessions/{sid}/exec", json={"command": swapper, "timeout": 10})
            )
            reads = []
            while not command.done():
                for route, kwargs in (
                    ("/files", {"params": {"path": "f"}}),
                    ("/step", {"json": {"name": "read_file", "arguments": {"path": "f"}}}),
                ):
                    method = "GET" if route == "/files" else "POST"
                    reads.append((await client.request(method, f"/v1/sessions/{sid}{route}", **kwargs)).text)
            await command
            return reads

    reads = asyncio.run(scenario())
    assert reads and not any(sandbox.token in text or "KUBERL_SANDBOX" in text for text in reads)


def test_a_link_swapped_in_for_a_folder_does_not_redirect_a_write(http, sid, tmp_path):
    """Row 4: the server's write lands as the session's user, never through a link, and no chown follows it."""
    outside = tmp_path / "root-owned"
    outside.mkdir()
    (outside / "x").write_text("root's\n")
    os.chmod(outside, 0o755)
    run(http, sid, f"ln -s {outside} d")
    observation = step(http, sid, "write_file", path="d/x", content="pwned")["observation"]
    assert observation.startswith("error:")
    assert (outside / "x").read_text() == "root's\n" and (outside / "x").stat().st_uid == 0
    assert step(http, sid, "write_file", path="e/x", content="mine")["observation"].startswith("Wrote")
    owner = run(http, sid, "stat -c %u e e/x; id -u")["output"].split()
    assert owner[0] == owner[1] == owner[2], "files the server writes belong to the session"


def test_a_patch_leaves_no_temp_file_and_is_written_as_the_session(http, sandbox, sid):
    """Row 5: the patch's temp file is the session's own and is removed afterwards."""
    diff = "--- a/module.py\n+++ b/module.py\n@@ -1,2 +1,2 @@\n def f():\n-    return 1\n+    return 2\n"
    response = http.post(f"/v1/sessions/{sid}/files/patch", json={"patch": diff})
    assert response.status_code == 200, response.text
    assert run(http, sid, "cat module.py")["output"].endswith("return 2\n")
    home = Path(sandbox.root) / sid
    assert not [p for p in home.rglob("*.diff")], "the patch's temp file was left behind"


# -------------------------------------------------------------------------------- 6: disk fill
def test_a_replace_that_would_pass_the_file_size_limit_is_refused_before_it_is_built(http, sid):
    """Row 6: 1 MiB of 'a', each replaced by 100 'b': 100 MiB, over the 64 MiB limit."""
    assert step(http, sid, "write_file", path="big.txt", content="a" * (1 << 20))["observation"].startswith("Wrote")
    started = time.monotonic()
    observation = step(http, sid, "replace", path="big.txt", old="a", new="b" * 100)["observation"]
    assert observation.startswith("error:") and "over the file size limit" in observation
    assert time.monotonic() - started < 2.0
    assert run(http, sid, "stat -c %s big.txt")["output"].strip() == str(1 << 20)


# ------------------------------------------------------------------------------ 7: edge inputs
EDGE_PATHS = [
    "module.py/x",
    "n" * 300,
    "loop",
    "a/" * 2100,
    "\n",
    "fifo",
    ".",
    "./",
    "nonexistent/deeper/file.py",
]


@pytest.mark.parametrize("path", EDGE_PATHS, ids=range(len(EDGE_PATHS)))
def test_edge_paths_get_an_error_not_a_500(http, sid, path):
    run(http, sid, "ln -s loop loop; mkfifo fifo")
    for response in (
        http.get(f"/v1/sessions/{sid}/files", params={"path": path}),
        http.post(f"/v1/sessions/{sid}/files", json={"path": path, "content": "x"}),
        http.post(f"/v1/sessions/{sid}/files/replace", json={"path": path, "old": "a", "new": "b"}),
        http.get(f"/v1/sessions/{sid}/list", params={"path": path}),
    ):
        assert response.status_code < 500, (response.request.url, response.text)
    for name, arguments in (
        ("read_file", {"path": path}),
        ("write_file", {"path": path, "content": "x"}),
        ("list_files", {"path": path}),
    ):
        result = http.post(f"/v1/sessions/{sid}/step", json={"name": name, "arguments": arguments})
        assert result.status_code == 200, result.text
    still_serving(http, sid)


def test_a_lone_surrogate_gets_an_error_not_a_500(http, sid):
    body = '{"name": "write_file", "arguments": {"path": "x\\ud800.py", "content": "y"}}'
    result = http.post(f"/v1/sessions/{sid}/step", content=body, headers={"Content-Type": "application/json"})
    assert result.status_code == 200 and result.json()["observation"].startswith("error:"), result.text
    body = '{"path": "ok.py", "content": "\\udcff"}'
    response = http.post(f"/v1/sessions/{sid}/files", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    still_serving(http, sid)


def test_a_file_name_that_is_not_utf8_breaks_nothing(http, sid):
    run(http, sid, "touch \"$(printf 'caf\\351.py')\"")
    still_serving(http, sid)
    names = [e["path"] for e in http.get(f"/v1/sessions/{sid}/list").json()["entries"]]
    assert "caf\\xe9.py" in names
    assert step(http, sid, "submit")["done"]


def test_files_the_server_writes_are_regular_and_the_sessions(http, sandbox, sid):
    assert step(http, sid, "write_file", path="pkg/new.py", content="x = 1\n")["observation"].startswith("Wrote")
    path = Path(sandbox.root) / sid / "work" / "pkg" / "new.py"
    info = path.lstat()
    assert stat.S_ISREG(info.st_mode) and info.st_uid != 0 and path.parent.stat().st_uid == info.st_uid
