"""Each session's own user, mount and network namespaces, made once when the session opens, with no privilege.

A small holder process, started as the session's uid, makes an unprivileged user namespace (its root mapped to
that uid) with a mount namespace (the session's fstab mounted: its private /tmp and the covers over the server's
installation, execution.make_private_root) and a network namespace inside, and waits; every command of the
session joins all three (execution.py), so nothing but the session's own loopback is reachable: not the host's
listeners, not its address, not abstract unix sockets of the host (they belong to a network namespace), not the
sandbox server itself. The holder exits when the server closes its stdin: at session close, or when the server
dies (the kernel closes the pipe).

With egress allowed, `slirp4netns` (a user-mode network stack from the distribution, run as the session's uid)
gives the namespace a route out through the server's own sockets; an nftables table in the namespace, set by the
holder's root before any command runs, rejects the host's own addresses, the stack's gateway (the host's
loopback), link-local addresses, cloud metadata endpoints and private networks (the cluster's pods and
services), but lets DNS queries reach the stack's forwarder. Commands run in a user namespace nested in the
holder's, without capabilities in it, so they can neither change those rules nor take the interface down.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from kuberl_sandbox.programs import CAT, IP, MOUNT, NFT, NSENTER, PRLIMIT, SETPRIV, SLIRP4NETNS, UNSHARE

READY = b"ready\n"
# Run as root of the new user namespace ($0: the session's fstab): mount what it names (mount's hints to /dev/null,
# its errors reach the server), bring up the loopback, say so, then wait for the server's pipe to close.
_MOUNTS = f'{MOUNT} --no-mtab --all --fstab "$0" >/dev/null || exit 1'
_HOLDER_SCRIPT = f"{_MOUNTS}; {IP} link set lo up || exit 1; echo ready; exec {CAT} >/dev/null"
_HOLDER_SCRIPT_SHARED_NETWORK = f"{_MOUNTS}; echo ready; exec {CAT} >/dev/null"
_OPEN_TIMEOUT_S = 10.0

SLIRP_GATEWAY = "10.0.2.2"
"""slirp4netns's gateway: the host itself (its loopback unless `--disable-host-loopback`)."""
SLIRP_GUEST = "10.0.2.100"
"""The session's own address on slirp4netns's network: the errors `reject` sends back go to it."""
SLIRP_DNS = "10.0.2.3"
"""slirp4netns's DNS forwarder (to the host's resolver): the one private address a session may reach."""
ALWAYS_BLOCKED = (
    SLIRP_GATEWAY,
    "169.254.0.0/16",  # link-local, and the metadata endpoints of most clouds (169.254.169.254)
    "100.100.100.200/32",  # Alibaba Cloud's metadata endpoint
    "10.0.0.0/8",  # private networks: the cluster's pods and services, the node's neighbours, a LAN
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",  # carrier-grade NAT, also used for pod networks
    "fe80::/10",
    "fc00::/7",  # unique local IPv6 (fd00:ec2::254, AWS's metadata endpoint, among them)
)


class NetworkUnavailable(RuntimeError):
    """A session's namespaces could not be made (the node forbids unprivileged user namespaces, say)."""


def namespace_path(holder_pid: int, kind: str) -> str:
    return f"/proc/{holder_pid}/ns/{kind}"


def join_argv(holder_pid: int, network: bool = True, cwd: str = "/") -> list[str]:
    """The argv prefix that runs the rest in `cwd` as root of the session's user namespace, in its mount and network
    namespaces (`network`; else in the server's network, for measurements only). The caller must already be the
    session's uid (the namespace's owner); credentials are kept as they are (its uid is the namespace's root), so
    no setgroups is needed, which the namespace denies."""
    net = [f"--net={namespace_path(holder_pid, 'net')}"] if network else []
    user, mount = namespace_path(holder_pid, "user"), namespace_path(holder_pid, "mnt")
    # --wdns: the folder as the session's mount namespace names it (--wd would keep the host's, unreachable there)
    return [NSENTER, "--preserve-credentials", f"--user={user}", f"--mount={mount}", *net, f"--wdns={cwd}", "--"]


def as_user(uid: int, gid: int) -> list[str]:
    """The argv prefix that runs the rest as `uid`/`gid`, with no supplementary groups and no_new_privs. Without
    root the prefix is empty (the server's own user is the session's; development only)."""
    if os.geteuid() != 0:
        return []
    return [SETPRIV, f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--no-new-privs", "--"]


def holder_argv(uid: int, gid: int, max_processes: int, fstab: Path, network: bool = True) -> list[str]:
    """The holder: a user namespace (root mapped to the session's uid) with a mount namespace where `fstab` is
    mounted and a network namespace (unless not `network`: measurements only). Its RLIMIT_NPROC becomes the
    namespace's: every command of the session counts against it."""
    limit = [PRLIMIT, f"--nproc={max_processes}", "--"]
    script = _HOLDER_SCRIPT if network else _HOLDER_SCRIPT_SHARED_NETWORK
    net = ["--net"] if network else []
    namespaces = [UNSHARE, "--user", "--map-root-user", "--mount", *net, "--", "/bin/sh", "-c", script, str(fstab)]
    return [*limit, *as_user(uid, gid), *namespaces]


def nft_ruleset(blocked: Iterable[str]) -> str:
    """An nftables table that rejects connections and datagrams to `blocked` (addresses or networks), but DNS
    queries to the user-mode stack's forwarder."""
    networks = [ipaddress.ip_network(b, strict=False) for b in blocked]
    # nft refuses overlapping intervals in one set: a host address inside a private network goes with it
    v4 = ", ".join(map(str, ipaddress.collapse_addresses(n for n in networks if n.version == 4)))
    v6 = ", ".join(map(str, ipaddress.collapse_addresses(n for n in networks if n.version == 6)))
    rules = [f"    ip daddr {SLIRP_GUEST} accept"]  # else the ICMP error of a reject is itself dropped: a hang
    rules += [f"    ip daddr {SLIRP_DNS} udp dport 53 accept", f"    ip daddr {SLIRP_DNS} tcp dport 53 accept"]
    rules += [f"    ip daddr {{ {v4} }} reject"] if v4 else []
    rules += [f"    ip6 daddr {{ {v6} }} reject"] if v6 else []
    body = "\n".join(rules)
    return (
        "table inet kuberl_session {\n"
        "  chain output {\n"
        "    type filter hook output priority 0; policy accept;\n"
        f"{body}\n"
        "  }\n"
        "}\n"
    )


def host_addresses() -> list[str]:
    """Every address of this host's (or pod's) interfaces but loopback: behind a user-mode stack a session
    could otherwise reach whatever listens on them. Raises NetworkUnavailable when they cannot be listed: egress
    is not allowed blind."""
    try:
        out = subprocess.run([IP, "-json", "address", "show"], capture_output=True, timeout=5, check=True).stdout
        interfaces = json.loads(out)
    except (OSError, subprocess.SubprocessError, ValueError) as err:
        raise NetworkUnavailable(f"cannot list this host's addresses, which egress must not reach: {err}") from None
    found = []
    for interface in interfaces:
        for info in interface.get("addr_info", []):
            address = info.get("local")
            if address and not ipaddress.ip_address(address).is_loopback:
                found.append(address)
    return found


@dataclass
class SessionNetwork:
    """The processes that hold one session's namespaces; `close` ends them."""

    holder: subprocess.Popen[bytes]
    network: bool = True
    """The holder made a network namespace (always but in measurements of what it costs)."""
    stack: subprocess.Popen[bytes] | None = None
    """slirp4netns when egress is allowed."""
    stack_exit: int | None = None
    """Write end of the pipe whose closing tells slirp4netns to exit."""

    @property
    def pid(self) -> int:
        return self.holder.pid

    @staticmethod
    def open(
        uid: int,
        gid: int,
        max_processes: int,
        fstab: Path,
        egress: bool,
        blocked: Iterable[str] = (),
        network: bool = True,
    ) -> SessionNetwork:
        """Start the holder as `uid` with the session's `fstab`; with `egress`, the firewall and the user-mode
        stack. Blocking (a few ms to start the holder, tens with egress): call it off the event loop. Not
        `network`: the session keeps the server's network (measurements of what a network namespace costs only)."""
        if egress and not network:
            raise ValueError("egress is guarded inside the session's own network namespace: it needs one")
        # Errors go to an unnamed file, read only if the start fails: a pipe nobody reads could fill and block a
        # process, or kill it once closed. Once up, the server keeps one descriptor per session (the holder's stdin).
        with tempfile.TemporaryFile() as errors:
            holder = subprocess.Popen(
                holder_argv(uid, gid, max_processes, fstab, network),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                cwd="/",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
            session = SessionNetwork(holder, network)
            try:
                assert holder.stdout is not None
                with holder.stdout:
                    ready = holder.stdout.readline()
                if ready != READY:
                    holder.wait(timeout=_OPEN_TIMEOUT_S)
                    why = _written(errors) or "the holder exited"
                    raise NetworkUnavailable(f"no user and network namespace for the session: {why}")
                if egress:
                    session._firewall(uid, gid, [*ALWAYS_BLOCKED, *blocked])
                    session._start_stack(uid, gid)
            except BaseException:
                session.close()
                raise
        return session

    def _firewall(self, uid: int, gid: int, blocked: list[str]) -> None:
        argv = [*as_user(uid, gid), *join_argv(self.pid), NFT, "-f", "-"]
        result = subprocess.run(
            argv, input=nft_ruleset(blocked).encode(), capture_output=True, timeout=_OPEN_TIMEOUT_S, cwd="/"
        )
        if result.returncode != 0:
            raise NetworkUnavailable(f"nft could not guard the session's egress: {result.stderr.decode().strip()}")

    def _start_stack(self, uid: int, gid: int) -> None:
        ready_r, ready_w = os.pipe()
        exit_r, exit_w = os.pipe()
        argv = [
            *as_user(uid, gid),
            SLIRP4NETNS,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--enable-seccomp",
            f"--ready-fd={ready_w}",
            f"--exit-fd={exit_r}",
            f"--userns-path={namespace_path(self.pid, 'user')}",
            "--netns-type=path",
            namespace_path(self.pid, "net"),
            "tap0",
        ]
        with tempfile.TemporaryFile() as errors:
            try:
                self.stack = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    pass_fds=(ready_w, exit_r),
                    cwd="/",
                )
            finally:
                os.close(ready_w)
                os.close(exit_r)
            self.stack_exit = exit_w
            with os.fdopen(ready_r, "rb") as ready:
                if ready.read(1) != b"1":
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self.stack.wait(timeout=1)
                    why = _written(errors)[-500:] or "no reason given"
                    raise NetworkUnavailable(f"slirp4netns did not start: {why}")

    def close(self) -> None:
        """End the stack and the holder (the namespaces go with their last process) and reap both."""
        if self.stack_exit is not None:
            os.close(self.stack_exit)
            self.stack_exit = None
        for proc in (self.stack, self.holder):
            if proc is None or proc.poll() is not None:
                continue
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for proc in (self.stack, self.holder):
            for stream in (proc.stdin, proc.stdout, proc.stderr) if proc is not None else ():
                if stream is not None:
                    stream.close()


def _written(file: IO[bytes]) -> str:
    """What a process wrote to `file`, as one stripped string."""
    file.seek(0)
    return file.read().decode(errors="replace").strip()
