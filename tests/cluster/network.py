"""The test node's network: a bridge with a /24 of 10.244.0.0/16 that no interface of this machine uses,
a network namespace and a veth pair per pod, the pods' /etc/hosts files (read by `ip netns exec` from
/etc/netns/NAME/hosts), and relays that make loopback-only servers of the host (the emulated API server,
S3) reachable from the pods at the bridge's address, the API server over TLS as in a cluster.

Everything is named with a prefix of its own (`krl` + 6 hex digits) and removed by `close`, which is
safe to call after a failure half-way through set-up.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import random
import re
import shutil
import ssl
import subprocess
import threading
import uuid
from pathlib import Path

_REQUEST_LINE = re.compile(r"(?:^|\r\n)(GET|POST|PUT|PATCH|DELETE) (/\S*) HTTP/1\.[01]\r\n")


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def _used_subnets() -> set[int]:
    """Third octets of the 10.244.x.0/24 networks any interface here already has."""
    used = set()
    for line in ip("-o", "-4", "addr").stdout.splitlines():
        for word in line.split():
            if word.startswith("10.244."):
                used.add(int(word.split(".")[2]))
    return used


class Relays:
    """TCP relays from (gateway IP, port) to 127.0.0.1 ports, some of them terminating TLS, in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="kuberl-node-relays")
        self.thread.start()
        self.servers: list[asyncio.AbstractServer] = []
        self.requests: list[tuple[str, str, str]] = []  # (client address, method, URL) of HTTP requests seen

    def add(self, host: str, port: int, target_port: int, tls: ssl.SSLContext | None = None) -> None:
        async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client: str | None) -> None:
            with contextlib.suppress(Exception):
                while data := await reader.read(65536):
                    if client is not None:  # the request lines, for the RBAC audit (tests/cluster/rbac_audit.py)
                        self.requests += [(client, m, u) for m, u in _REQUEST_LINE.findall(data.decode("latin-1"))]
                    writer.write(data)
                    await writer.drain()
            with contextlib.suppress(Exception):
                writer.close()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", target_port)
            except OSError:
                writer.close()
                return
            client = writer.get_extra_info("peername")[0] if tls is not None else None  # the API server's
            await asyncio.gather(pipe(reader, upstream_writer, client), pipe(upstream_reader, writer, None))

        async def start() -> asyncio.AbstractServer:
            return await asyncio.start_server(handle, host, port, ssl=tls)

        self.servers.append(asyncio.run_coroutine_threadsafe(start(), self.loop).result(10))

    def close(self) -> None:
        async def stop() -> None:
            for server in self.servers:
                server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class NodeNetwork:
    """The bridge, the pods' namespaces and addresses, and the relays to host services."""

    def __init__(self, workdir: Path) -> None:
        self.prefix = "krl" + uuid.uuid4().hex[:6]
        self.bridge = self.prefix + "br"
        self.workdir = workdir
        self.namespaces: dict[str, str] = {}  # pod namespace -> the host's end of its veth pair
        self.free = list(range(2, 255))
        self.relays: Relays | None = None
        third = random.choice(sorted(set(range(100, 250)) - _used_subnets()))
        self.subnet = ipaddress.ip_network(f"10.244.{third}.0/24")
        self.gateway = str(self.subnet.network_address + 1)

    def open(self) -> None:
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        self.relays = Relays()

    def relay(self, port: int, target_port: int, tls: ssl.SSLContext | None = None) -> None:
        """Serve 127.0.0.1:`target_port` to the pods at gateway:`port`."""
        assert self.relays is not None
        self.relays.add(self.gateway, port, target_port, tls)

    def api_server_tls(self) -> tuple[ssl.SSLContext, Path]:
        """A self-signed certificate for the API server's addresses; (server context, CA file for pods)."""
        cert, key = self.workdir / "apiserver.crt", self.workdir / "apiserver.key"
        names = f"IP:{self.gateway},DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
        subprocess.run(
            [
                *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=kubernetes"),
                *("-keyout", str(key), "-out", str(cert), "-addext", f"subjectAltName={names}"),
            ],
            check=True,
            capture_output=True,
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context, cert

    def add_pod(self, index: int) -> tuple[str, str]:
        """A namespace with eth0 on the bridge; (namespace name, pod IP)."""
        name, host_end = f"{self.prefix}-{index}", f"{self.prefix}v{index}"
        address = str(self.subnet.network_address + self.free.pop(0))
        self.namespaces[name] = host_end
        Path(f"/etc/netns/{name}").mkdir(parents=True, exist_ok=True)
        Path(f"/etc/netns/{name}/hosts").write_text("127.0.0.1 localhost\n")
        # nothing answers DNS: a name not in the hosts file fails at once instead of timing out
        Path(f"/etc/netns/{name}/resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
        ip("netns", "add", name)
        ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", name)
        ip("link", "set", host_end, "master", self.bridge, "up")
        ip("-n", name, "addr", "add", f"{address}/24", "dev", "eth0")
        ip("-n", name, "link", "set", "eth0", "up")
        ip("-n", name, "link", "set", "lo", "up")
        ip("-n", name, "route", "add", "default", "via", self.gateway)
        return name, address

    def write_hosts(self, namespace: str, text: str) -> None:
        """Rewrite a pod's hosts file in place: `ip netns exec` bind-mounted this very inode over /etc/hosts.
        The new text is written over the old before the file is cut to length, so a reader never sees it
        empty."""
        path = Path(f"/etc/netns/{namespace}/hosts")
        with contextlib.suppress(FileNotFoundError), path.open("r+") as f:
            if f.read() == text:
                return
            f.seek(0)
            f.write(text)
            f.truncate()

    def remove_pod(self, namespace: str, address: str) -> None:
        self._remove(namespace)
        self.free.append(int(address.rsplit(".", 1)[1]))

    def _remove(self, namespace: str) -> None:
        # The veth pair first: a namespace outlives `ip netns del` while another program's mount namespace,
        # made meanwhile, holds a copy of its /run/netns mount; deleting one end removes both.
        ip("link", "del", self.namespaces.pop(namespace, ""), check=False)
        ip("netns", "del", namespace, check=False)
        shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)

    def close(self) -> None:
        if self.relays is not None:
            self.relays.close()
        for name in list(self.namespaces):
            self._remove(name)
        ip("link", "del", self.bridge, check=False)
