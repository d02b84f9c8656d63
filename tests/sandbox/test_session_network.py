"""What a session's commands can reach, tried from inside: each session has a network of its own (only its
loopback, or with egress allowed a guarded way out), no view of the server's installation, and the namespaces go
with the session. A server that cannot make them says so in one line and does not start.

These need an isolated server (root): each test skips, saying so, where sessions share the server's user."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from conftest import REPO
from helpers.sandbox_http import client, open_session, run

from kuberl.api import env_vars
from kuberl_sandbox.local import SandboxEndpoint, local_sandbox
from kuberl_sandbox.session_network import host_addresses

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="sessions are isolated only under a root server")

TASK = {"taskId": "network", "prompt": "p", "files": {"notes.txt": "mine\n"}}
# Prints `connected`, or the error the connection met.
CONNECT = """
import socket, sys
family, address = sys.argv[1], sys.argv[2]
if family == "unix":
    s, target = socket.socket(socket.AF_UNIX), "\\0" + address
else:
    host, port = address.rsplit(":", 1)
    s, target = socket.create_connection, (host.strip("[]"), int(port))
try:
    (s(target, timeout=3) if family != "unix" else s.connect(target))
    print("connected")
except OSError as err:
    print(type(err).__name__, err)
"""


@pytest.fixture
def http(sandbox) -> Iterator[httpx.Client]:
    with client(sandbox) as c:
        yield c


@pytest.fixture(scope="module")
def egress_sandbox() -> Iterator[SandboxEndpoint]:
    """A server whose sessions may reach out (spec.sandbox.egress: allow) through slirp4netns."""
    if not os.access("/dev/net/tun", os.R_OK | os.W_OK) or not Path("/usr/bin/slirp4netns").exists():
        pytest.skip("egress needs slirp4netns and /dev/net/tun (make install provides both)")
    with local_sandbox(env={env_vars.SANDBOX_EGRESS: "allow"}) as server:
        yield server


def new_session(http: httpx.Client) -> str:
    return open_session(http, TASK)


def connect_from(http: httpx.Client, sid: str, family: str, address: str) -> str:
    return run(http, sid, f"python3 -c {shlex.quote(CONNECT)} {family} {shlex.quote(address)}")["output"].strip()


class Listener:
    """A listener of the host's (the test process's network namespace) that counts who got through."""

    def __init__(self, family: int, address: object) -> None:
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.accepted = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self.sock.close()


def host_listeners(sandbox: SandboxEndpoint) -> Iterator[tuple[str, str, str, Listener | None]]:
    """(case, family, address as the session names it, the listener or None when the server itself listens)."""
    loopback = Listener(socket.AF_INET, ("127.0.0.1", 0))
    yield "host-loopback", "tcp", f"127.0.0.1:{loopback.sock.getsockname()[1]}", loopback
    wildcard = Listener(socket.AF_INET, ("0.0.0.0", 0))
    for address in [a for a in host_addresses() if ":" not in a][:1]:
        yield "host-address", "tcp", f"{address}:{wildcard.sock.getsockname()[1]}", wildcard
    name = f"kuberl-test-{os.getpid()}-{time.monotonic_ns()}"
    abstract = Listener(socket.AF_UNIX, "\0" + name)
    yield "abstract-unix-socket", "unix", name, abstract
    yield "sandbox-server", "tcp", sandbox.url.removeprefix("http://"), None


def assert_host_unreachable(http: httpx.Client, sid: str, sandbox: SandboxEndpoint) -> None:
    for case, family, address, listener in host_listeners(sandbox):
        try:
            outcome = connect_from(http, sid, family, address)
            assert outcome != "connected" and outcome, f"{case}: {outcome}"
            assert listener is None or listener.accepted == 0, f"{case}: the host's listener was reached"
        finally:
            if listener is not None:
                listener.close()


def test_a_session_has_only_its_own_loopback(http):
    sid = new_session(http)
    names = run(http, sid, "python3 -c 'import socket; print(sorted(n for _, n in socket.if_nameindex()))'")
    assert names["output"].strip() == "['lo']", names


def test_nothing_of_the_host_is_reachable_from_a_session(sandbox, http):
    assert_host_unreachable(http, new_session(http), sandbox)


def test_two_sessions_do_not_share_a_loopback(http):
    first, second = new_session(http), new_session(http)
    port = 18000 + os.getpid() % 1000
    listen = (
        f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
        f"socket.create_connection(('127.0.0.1', {port})); print('listening', flush=True); time.sleep(4)"
    )
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(run(http, first, f"python3 -c {shlex.quote(listen)}")))
    thread.start()
    time.sleep(1.5)  # the listener is up: its own session reaches it (checked in its output below)
    with client_like(http) as other:
        outcome = connect_from(other, second, "tcp", f"127.0.0.1:{port}")
    thread.join()
    assert result["output"].startswith("listening"), result
    assert "ConnectionRefusedError" in outcome, outcome


def client_like(http: httpx.Client) -> httpx.Client:
    return httpx.Client(base_url=http.base_url, headers=http.headers, timeout=60)


def test_a_sessions_namespaces_go_with_it(http):
    sid = new_session(http)
    uid = int(run(http, sid, "id -u")["output"])
    assert processes_of(uid), "the session's namespaces are held while it is open"
    assert http.delete(f"/v1/sessions/{sid}").status_code == 204
    assert processes_of(uid) == [], "the session's namespace holder outlived it"


def processes_of(uid: int) -> list[str]:
    out = subprocess.run(["ps", "-u", str(uid), "-o", "pid=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.strip()]


def test_the_servers_installation_and_history_are_out_of_sight(http):
    """The task generator (and so the hidden checks it draws) is on this machine: a session sees none of it,
    not its source, not the checkout's git history, not an import of the package."""
    generator = REPO / "kuberl" / "suites" / "swe_toy.py"
    assert generator.is_file()
    sid = new_session(http)
    probes = {
        "source": f"cat {generator}",
        "listing": f"ls -A {REPO}",
        "history": f"git -C {REPO} log -1 2>&1 || ls -A {REPO / '.git'}",
        "import": "python3 -c 'import kuberl.suites.swe_toy' 2>&1 | tail -1",
    }
    seen = {name: run(http, sid, command)["output"] for name, command in probes.items()}
    assert "def " not in seen["source"] and "No such file" in seen["source"], seen
    # an empty, read-only folder covers the checkout; a checkout under /tmp is not there at all (private /tmp)
    assert seen["listing"] == "" or "No such file" in seen["listing"], seen
    assert "commit" not in seen["history"], seen
    assert "ModuleNotFoundError" in seen["import"], seen
    planted = run(http, sid, f"touch {REPO}/planted")["output"]
    assert any(why in planted for why in ("Read-only file system", "Permission denied", "No such file")), planted


def test_egress_reaches_out_but_never_the_host_or_metadata(egress_sandbox):
    with client(egress_sandbox) as http:
        sid = new_session(http)
        assert_host_unreachable(http, sid, egress_sandbox)
        for address in ("169.254.169.254:80", "10.0.2.2:22"):
            outcome = connect_from(http, sid, "tcp", address)
            assert "ConnectionRefusedError" in outcome, f"{address}: {outcome}"
        rules = run(http, sid, "nft flush ruleset; echo rc=$?; ip link set tap0 down; echo rc=$?")
        assert rules["output"].count("rc=0") == 0, rules
        outside = outside_address()
        if outside is not None:  # the machine itself reaches the internet: so must an allowed session
            assert connect_from(http, sid, "tcp", outside) == "connected"


def outside_address() -> str | None:
    """An address outside this machine that it reaches (the package index), or None offline."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError:
        return None
    return "pypi.org:443"


POD_USER_NAMESPACE = """
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
ready, told = os.pipe()
child = os.fork()
if child == 0:
    os._exit(1) if libc.unshare(0x10000000) else os.write(told, b"x")
    signal.pause()
os.read(ready, 1)
ids = "0 0 1\\n1 100001 65535"
for name, text in (("setgroups", "allow"), ("uid_map", ids), ("gid_map", ids)):
    with open(f"/proc/{child}/{name}", "w") as f:
        f.write(text)
if libc.setns(os.open(f"/proc/{child}/ns/user", os.O_RDONLY), 0x10000000):
    raise OSError(ctypes.get_errno(), "setns")
os.kill(child, signal.SIGKILL)
with open("/proc/sys/user/max_user_namespaces", "w") as f:  # this namespace's own limit: a node that forbids them
    f.write("0")
os.execvp(sys.argv[1], sys.argv[1:])
"""


def test_a_node_without_user_namespaces_gets_one_clear_line_at_start_up():
    launcher = [sys.executable, "-c", POD_USER_NAMESPACE]
    with pytest.raises(RuntimeError) as failed, local_sandbox(ready_timeout=30, launcher=launcher):
        pass
    lines = [line for line in str(failed.value).splitlines() if line.startswith("sandbox: cannot isolate sessions")]
    assert len(lines) == 1, str(failed.value)[-2000:]
    assert "user namespace" in lines[0] and "KUBERL_SANDBOX_ALLOW_SHARED_USER" in lines[0]


def test_the_reason_a_server_cannot_isolate_sessions_is_one_line():
    # the line is what the operator copies into the job's status: the cause kept, on one line
    from kuberl_sandbox.session_manager import isolation_problem
    from kuberl_sandbox.settings import SandboxSettings

    line = isolation_problem(SandboxSettings(root=Path("/tmp/x"), token="t"), "unshare failed:\n  No space left")
    assert line is not None and "\n" not in line and "unshare failed: No space left" in line
