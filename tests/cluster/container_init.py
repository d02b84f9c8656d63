"""The first process of a test pod's container, run by the node agent (tests/cluster/kubelet.py) as

    ip netns exec POD unshare --mount --uts --pid --fork --mount-proc --propagation private \
        PYTHON container_init.py SPEC.json

so it starts as PID 1 of a fresh PID namespace, in a mount and UTS namespace of its own and the pod's network
namespace. It does what a container runtime does before the entrypoint: mounts a fresh /run and the pod's
volumes at their mount paths (bind mounts, a tmpfs for `medium: Memory`), makes the root filesystem read-only when the
container asks for it, sets the hostname, drops to the container's user and groups, and execs the command
(PID 1 stays the container's process, as in a container: SIGTERM reaches it only if it handles it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def main(spec_file: str) -> None:
    with open(spec_file) as f:
        spec = json.load(f)
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
    with open("/proc/sys/kernel/hostname", "w") as f:
        f.write(spec["hostname"])
    os.chdir(spec.get("workdir") or "/")
    if spec.get("gid") is not None:
        os.setgroups(spec.get("groups") or [])
        os.setgid(spec["gid"])
    if spec.get("uid") is not None:
        os.setuid(spec["uid"])
    argv = spec["argv"]
    try:
        os.execve(argv[0], argv, spec["env"])
    except OSError as err:
        print(f"container_init: cannot exec {argv[0]}: {err}", file=sys.stderr, flush=True)
        sys.exit(127)


if __name__ == "__main__":
    main(sys.argv[1])
