"""What one session can learn of another: nothing through the scratch folders (/tmp, /var/tmp, /dev/shm,
/run/lock), the process list, SysV IPC, or a uid shared with a session of another server on the host; and no
command can raise its privileges (no_new_privs) or keeps the server's supplementary groups.

These need an isolated server (root): each test skips, saying so, where sessions share the server's user."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from kuberl_sandbox.local import SandboxEndpoint, local_sandbox
from kuberl_sandbox.settings import SandboxSettings

TASK = {"taskId": "privacy", "prompt": "p", "files": {"secret.txt": "session-secret\n"}}
SCRATCH = [d for d in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock") if os.path.isdir(d)]


def client(server: SandboxEndpoint) -> httpx.Client:
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.token}"}, timeout=60)


@pytest.fixture
def http(sandbox) -> Iterator[httpx.Client]:
    with client(sandbox) as c:
        yield c


def new_session(http: httpx.Client) -> str:
    response = http.post("/v1/sessions", json={"task": TASK})
    assert response.status_code == 201, response.text
    if not response.json()["isolated"]:
        pytest.skip("the server is not isolated (not root): its sessions share one user, /tmp and /proc")
    return response.json()["sessionId"]


def run(http: httpx.Client, sid: str, command: str, timeout: float = 10) -> dict:
    response = http.post(f"/v1/sessions/{sid}/exec", json={"command": command, "timeout": timeout})
    assert response.status_code == 200, response.text
    return response.json()


def uid_of(http: httpx.Client, sid: str) -> int:
    return int(run(http, sid, "id -u")["output"])


def host_processes_of(uid: int) -> str:
    return subprocess.run(["ps", "-u", str(uid), "-o", "args="], capture_output=True, text=True).stdout


def test_scratch_folders_are_the_sessions_own_and_go_with_it(sandbox, http):
    writer, reader = new_session(http), new_session(http)
    name = f"kuberl-privacy-{secrets.token_hex(6)}"
    files = " ".join(f"{d}/{name}" for d in SCRATCH)
    result = run(http, writer, f"for f in {files}; do echo writer-secret > $f || echo FAILED $f; done")
    assert result["exitCode"] == 0 and "FAILED" not in result["output"], result
    # they last between the commands of the session...
    assert run(http, writer, f"cat {files}")["output"] == "writer-secret\n" * len(SCRATCH)
    # ...no other session sees them, by name or by listing...
    assert "writer-secret" not in run(http, reader, f"cat {files}")["output"]
    listing = run(http, reader, f"ls -a {' '.join(SCRATCH)}")["output"]
    assert name not in listing, listing
    # ...nor the host...
    assert not [d for d in SCRATCH if os.path.lexists(f"{d}/{name}")]
    # ...and they are gone with the session
    assert http.delete(f"/v1/sessions/{writer}").status_code in (200, 204)
    assert not (sandbox.root / writer).exists()
    assert not list(sandbox.root.rglob(f"{name}*"))
    assert name not in run(http, new_session(http), f"ls -a {' '.join(SCRATCH)}")["output"]


def test_a_session_sees_no_process_of_another(http):
    busy, looker = new_session(http), new_session(http)
    busy_uid, looker_uid = uid_of(http, busy), uid_of(http, looker)
    marker = "sleep 4.321"  # distinctive in a command line

    def busy_command() -> None:
        with client_like(http) as other:
            run(other, busy, f"{marker}; echo done")

    thread = threading.Thread(target=busy_command)
    thread.start()
    try:
        deadline = time.monotonic() + 5
        while marker not in host_processes_of(busy_uid):  # it runs now: the host sees it
            assert time.monotonic() < deadline, "the busy session's command never started"
            time.sleep(0.05)
        seen = run(http, looker, "ps -eo uid=,args=; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")["output"]
        owners = {line.split()[0] for line in seen.splitlines() if line.strip() and line.split()[0].isdigit()}
    finally:
        thread.join()
    assert marker not in seen, seen
    assert owners == {str(looker_uid)}, seen  # nothing but the looker's own command
    # /proc lists the looker's shell, ls and grep at most
    assert int(run(http, looker, "ls /proc | grep -c '^[0-9]'")["output"]) <= 3


def client_like(http: httpx.Client) -> httpx.Client:
    """Another client to the same server (for a second thread)."""
    return httpx.Client(base_url=http.base_url, headers=http.headers, timeout=60)


@pytest.mark.skipif(not shutil.which("ipcmk"), reason="no ipcmk (util-linux) on this machine")
def test_sysv_shared_memory_is_not_shared_with_other_sessions(http):
    maker, looker = new_session(http), new_session(http)
    maker_uid = uid_of(http, maker)
    made = run(http, maker, "ipcmk -M 4096 -p 0644")
    assert made["exitCode"] == 0, made
    listed = run(http, looker, "ipcs -m -c")["output"]
    host = subprocess.run(["ipcs", "-m", "-c"], capture_output=True, text=True).stdout
    assert str(maker_uid) not in listed and str(maker_uid) not in host, (listed, host)


def test_two_servers_on_one_host_give_sessions_uids_of_different_blocks(sandbox, second_sandbox):
    defaults = SandboxSettings(root=Path("/unused"), token="unused")

    def block(uid: int) -> int:
        return (uid - defaults.uid_base) // defaults.uid_block_size

    with client(sandbox) as first, client(second_sandbox) as second:
        mine, theirs = new_session(first), new_session(second)
        mine_uid, theirs_uid = uid_of(first, mine), uid_of(second, theirs)
        assert block(mine_uid) != block(theirs_uid), (mine_uid, theirs_uid)
        workspace = sandbox.root / mine / "work"
        assert os.stat(workspace).st_uid == mine_uid  # 0700: only `mine` can enter it
        # (where the first server's root lies under /tmp, the second's sessions do not even find it)
        result = run(second, theirs, f"cat {workspace}/secret.txt; ls {workspace}")
        assert "session-secret" not in result["output"] and result["exitCode"] != 0, result


HOLD_A_BLOCK = """
import pathlib, sys, time
from kuberl_sandbox.uids import claim_block
print(claim_block(1000, 10, 3, [pathlib.Path(sys.argv[1])]).first, flush=True)
time.sleep(60)
"""


def test_uid_blocks_are_each_held_by_one_process_and_freed_when_it_dies(tmp_path):
    from kuberl_sandbox.uids import NoFreeUidBlock, claim_block  # (a module of its own: what the servers share)

    locks = [tmp_path / "uid-blocks"]
    first, second = claim_block(1000, 10, 3, locks), claim_block(1000, 10, 3, locks)
    assert (first.first, second.first) == (1000, 1010)
    assert [second.uid(n) for n in (0, 9, 10)] == [1010, 1019, 1010]  # wraps inside its block
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_BLOCK, str(locks[0])], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "1020"
        with pytest.raises(NoFreeUidBlock, match="held by other sandbox servers"):
            claim_block(1000, 10, 3, locks)
    finally:
        holder.kill()  # no clean-up of its own: the kernel drops its lock
        holder.wait()
    assert claim_block(1000, 10, 3, locks).first == 1020
    first.release()
    assert claim_block(1000, 10, 3, locks).first == 1000


def test_uid_block_locks_are_not_kept_where_others_could_plant_them(tmp_path):
    from kuberl_sandbox.uids import NoFreeUidBlock, claim_block

    planted = tmp_path / "planted"
    planted.mkdir()
    os.chmod(planted, 0o777)  # as if another user had made it, world-writable, in the temp dir first
    with pytest.raises(NoFreeUidBlock, match="nowhere to keep"):
        claim_block(1000, 10, 3, [planted])
    assert claim_block(1000, 10, 3, [planted, tmp_path / "fallback"]).lock.parent == tmp_path / "fallback"


def test_commands_run_with_no_new_privs_and_no_capabilities(http):
    status = run(http, new_session(http), "grep -E '^(NoNewPrivs|CapPrm|CapEff|CapAmb):' /proc/self/status")
    fields = dict(line.split(":\t") for line in status["output"].splitlines())
    assert fields == {"NoNewPrivs": "1", "CapPrm": "0" * 16, "CapEff": "0" * 16, "CapAmb": "0" * 16}, status


@pytest.fixture(scope="module")
def grouped_sandbox() -> Iterator[SandboxEndpoint]:
    """A server whose own process has supplementary groups (adm, sudo): commands must not inherit them."""
    if os.geteuid() != 0:
        pytest.skip("the server is not isolated (not root): sessions run as the server's own user and groups")
    with local_sandbox(extra_groups=[4, 27]) as server:
        yield server


def test_commands_have_no_supplementary_groups(grouped_sandbox):
    """Started with groups 4 and 27, the server drops them (its file tools act with the session's file uid
    and gid, but the process's groups), and commands get none either."""
    server_groups = Path(f"/proc/{grouped_sandbox.pid}/status").read_text().split("Groups:")[1].split("\n")[0]
    assert server_groups.split() == []
    with client(grouped_sandbox) as http:
        result = run(http, new_session(http), "id -g; id -G; grep '^Groups:' /proc/self/status")
    gid, groups, status = result["output"].splitlines()
    assert groups.split() == [gid] and status.split() == ["Groups:"], result
