"""The first process of a test pod's container, run by the node agent (tests/cluster/kubelet.py) as

    ip netns exec POD unshare --mount --uts --pid --fork --mount-proc --propagation private \
        PYTHON container_init.py SPEC.json

so it starts as PID 1 of a fresh PID namespace, in a mount and UTS namespace of its own and the pod's network
namespace. It does what a container runtime does before the entrypoint: makes the image's root filesystem the
container's root when the image is a real one (enter_image; else the node's root, with the checkout standing in),
mounts a fresh /run and the pod's volumes at their mount paths (bind mounts, a tmpfs for `medium: Memory`) and
the file for its termination message (/dev/termination-log),
makes the root filesystem read-only when the container asks for it, sets the hostname, drops to the
container's user and groups, and execs the command (PID 1 stays the container's process, as in a container:
SIGTERM reaches it only if it handles it).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import subprocess
import sys

# mount(2) flags and pivot_root's syscall number: after pivot_root the node's `mount` is out of reach, and
# an image need not have one
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384
MNT_DETACH = 2
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 24, 38, 47, 4
CAPABILITIES = [  # by number, as linux/capability.h has them
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
]
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
LIBC = ctypes.CDLL(None, use_errno=True)
DEVICES = ("null", "zero", "full", "random", "urandom", "tty", "net/tun")


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def sys_mount(source: str, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    def c(text: str | None) -> bytes | None:
        return text.encode() if text is not None else None

    if LIBC.mount(c(source), c(target), c(fstype), ctypes.c_ulong(flags), c(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {source} on {target} ({fstype or 'bind'}): {os.strerror(errno)}")


def bind(source: str, target: str, read_only: bool = False) -> None:
    """A bind mount at `target` (made as a folder or a file like `source`), read-only when asked."""
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    elif not os.path.exists(target):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    sys_mount(source, target, flags=MS_BIND | MS_REC)
    if read_only:
        sys_mount("none", target, flags=MS_REMOUNT | MS_BIND | MS_RDONLY)


def enter_image(spec: dict) -> None:
    """The image's root filesystem as the container's root, the way a runtime makes it: a fresh writable
    layer (overlayfs, in memory) over the image, pivot_root into it, then /proc, /dev, /sys, /run, the pod's
    /etc/hosts and the volumes, the node's root detached. A pivoted root (not a chroot) lets the container's
    programs make user namespaces, as the sandbox server does for every session."""
    layer = spec["layer"]
    os.makedirs(layer, exist_ok=True)
    sys_mount("tmpfs", layer, "tmpfs", data="mode=755,size=1g")
    for part in ("upper", "work", "root"):
        os.mkdir(f"{layer}/{part}")
    new = f"{layer}/root"
    sys_mount("overlay", new, "overlay", data=f"lowerdir={spec['rootfs']},upperdir={layer}/upper,workdir={layer}/work")
    os.makedirs(f"{new}/.node", exist_ok=True)
    if LIBC.syscall(SYS_PIVOT_ROOT[platform.machine()], new.encode(), f"{new}/.node".encode()) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"pivot_root into {spec['rootfs']}: {os.strerror(errno)}")
    os.chdir("/")
    node = "/.node"  # the node's root, until it is detached below
    os.makedirs("/proc", exist_ok=True)
    sys_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs("/dev", exist_ok=True)
    sys_mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "mode=755,size=64k")
    for device in DEVICES:
        if os.path.exists(f"{node}/dev/{device}"):
            bind(f"{node}/dev/{device}", f"/dev/{device}")
    os.makedirs("/dev/shm", mode=0o1777)
    sys_mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64m")
    os.makedirs("/dev/pts")
    sys_mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
    for name, target in (("ptmx", "pts/ptmx"), ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0")):
        os.symlink(target, f"/dev/{name}")
    os.symlink("/proc/self/fd/1", "/dev/stdout")
    os.symlink("/proc/self/fd/2", "/dev/stderr")
    os.makedirs("/sys", exist_ok=True)
    bind(f"{node}/sys", "/sys", read_only=True)  # `ip netns exec` mounted the pod's network namespace's
    os.makedirs("/run", exist_ok=True)
    sys_mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=16m")
    os.makedirs("/run/lock", mode=0o1777)
    os.chmod("/run/lock", 0o1777)
    bind(f"{node}/etc/hosts", "/etc/hosts")  # the pod's, bound over the node's by `ip netns exec`
    if os.path.exists(f"{node}/etc/resolv.conf"):
        bind(f"{node}/etc/resolv.conf", "/etc/resolv.conf", read_only=True)
    for m in spec["mounts"]:  # targets resolve inside the image (its /var/run is a link to /run)
        if m.get("tmpfs"):
            os.makedirs(m["target"], exist_ok=True)
            sys_mount("tmpfs", m["target"], "tmpfs", data="mode=1777,size=512m")
        else:
            bind(node + m["source"], m["target"], read_only=m.get("readOnly", False))
    if LIBC.umount2(node.encode(), MNT_DETACH) != 0:
        raise OSError(ctypes.get_errno(), "detaching the node's root")
    os.rmdir(node)
    if spec.get("readOnlyRoot"):
        sys_mount("none", "/", flags=MS_REMOUNT | MS_BIND | MS_RDONLY)
        sys_mount("none", "/run", flags=MS_REMOUNT | MS_NOSUID | MS_NODEV | MS_RDONLY)


def limit_privileges(spec: dict) -> None:
    """Keep only the container's capabilities in the bounding set (what root's programs get at exec; another
    uid gets none) and set no_new_privs when privilege escalation is off, as a runtime does."""
    if spec.get("capabilities") is not None:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
        dropped = [n for n in range(last + 1) if n >= len(CAPABILITIES) or CAPABILITIES[n] not in spec["capabilities"]]
        for number in dropped:
            if LIBC.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), f"dropping capability {number}")
        LIBC.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if spec.get("noNewPrivileges") and LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "no_new_privs")


def enter_checkout(spec: dict) -> None:
    """The node's own root, with the checkout's virtual environment standing in for the image."""
    for exposed in spec.get("expose") or []:  # a folder under a 0700 parent (the interpreter under /root)
        path, parent = exposed["path"], os.path.dirname(exposed["path"])
        mount("--bind", path, exposed["staging"])
        mount("-t", "tmpfs", "-o", "mode=755,size=1m", "tmpfs", parent)
        os.mkdir(path)
        mount("--bind", exposed["staging"], path)
    # /run is the image's (empty but for /run/lock), not the node's: run-time state a container finds there
    # would otherwise be whatever this machine's other programs left
    mount("-t", "tmpfs", "-o", "mode=755,size=16m", "tmpfs", "/run")
    os.makedirs("/run/lock", mode=0o1777)
    # a folder that stands in for the image (the checkout) but lies under a volume's mount path (a clone
    # under /tmp, a /tmp volume) is kept in view: held at its staging folder, bound back once the volumes are in
    for kept in spec.get("keep") or []:
        mount("--bind", kept["path"], kept["staging"])
    for m in spec["mounts"]:
        if m.get("file"):  # a file's mount point (the termination message's): the node's, or made in /run
            if not os.path.exists(m["target"]):
                os.makedirs(os.path.dirname(m["target"]), exist_ok=True)
                open(m["target"], "a").close()
            mount("--bind", m["source"], m["target"])
            continue
        os.makedirs(m["target"], exist_ok=True)
        if m.get("tmpfs"):
            mount("-t", "tmpfs", "-o", "mode=1777,size=512m", "tmpfs", m["target"])
            continue
        mount("--bind", m["source"], m["target"])
        if m.get("readOnly"):
            mount("-o", "remount,bind,ro", m["target"])
    for kept in spec.get("keep") or []:
        os.makedirs(kept["path"], exist_ok=True)  # inside the volume that hid it
        mount("--bind", kept["staging"], kept["path"])
    if spec.get("readOnlyRoot"):
        mount("-o", "remount,bind,ro", "/")
        mount("-o", "remount,ro", "/run")


def main(spec_file: str) -> None:
    with open(spec_file) as f:
        spec = json.load(f)
    if spec.get("rootfs"):
        enter_image(spec)
    else:
        enter_checkout(spec)
    with open("/proc/sys/kernel/hostname", "w") as f:
        f.write(spec["hostname"])
    os.chdir(spec.get("workdir") or "/")
    limit_privileges(spec)
    if spec.get("gid") is not None:
        os.setgroups(spec.get("groups") or [])
        os.setgid(spec["gid"])
    if spec.get("uid") is not None:
        os.setuid(spec["uid"])
    argv = spec["argv"]
    try:
        os.execvpe(argv[0], argv, spec["env"])  # a bare name: looked up on the container's PATH
    except OSError as err:
        print(f"container_init: cannot exec {argv[0]}: {err}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
