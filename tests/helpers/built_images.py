"""KubeRL's real images for tests: `built_image("operator")` builds the image once (images/build.py) when the
local container storage lacks it and returns its reference; `image_rootfs` unpacks one's root filesystem."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = ("operator", "sandbox", "learner", "rollout")
# the storage the builder writes (buildah/podman/skopeo share /var/lib/containers/storage)
STORAGE = ["--storage-driver", "vfs"]
# crun fails on this kind of machine's hybrid cgroup layout; runc and cgroupfs work
PODMAN = ["podman", *STORAGE, "--runtime", "runc", "--cgroup-manager", "cgroupfs"]
TOOLS = ("buildah", "podman", "skopeo", "debootstrap", "runc")

_lock = threading.Lock()
_checked: set[str] = set()
# one image build at a time on this machine: pytest-xdist's workers (and two test runs) share the storage and the
# debootstrap base, which two builders at once would both make
BUILD_LOCK = Path("/var/tmp/kuberl-image-build.lock")


@contextlib.contextmanager
def exclusive_build() -> Iterator[None]:
    """Hold the machine's image-build lock (across threads and processes) while building."""
    with _lock, BUILD_LOCK.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def missing_tools() -> list[str]:
    """The image tools this machine lacks (install them: apt-get install buildah podman skopeo debootstrap runc)."""
    return [tool for tool in TOOLS if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists()]


def image_reference(tier: str) -> str:
    """The local reference of a tier's image, e.g. ghcr.io/kuberl/operator:0.1.0 (what the chart defaults to)."""
    if tier not in TIERS:
        raise ValueError(f"unknown image tier {tier!r}; one of {', '.join(TIERS)}")
    out = subprocess.run(
        [sys.executable, str(REPO / "images/build.py"), "--print-reference", tier],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def image_exists(reference: str) -> bool:
    """Whether the local container storage holds `reference`."""
    result = subprocess.run(["podman", *STORAGE, "image", "exists", reference], capture_output=True)
    return result.returncode == 0


def built_image(tier: str) -> str:
    """The local reference of `tier`'s image, built first (once per process) when the storage lacks it or it
    was built from an older checkout (the builder decides; a current image is reused in seconds)."""
    with exclusive_build():
        reference = image_reference(tier)
        if tier not in _checked:
            if missing := missing_tools():
                raise RuntimeError(f"cannot build images: missing {', '.join(missing)} (apt-get install them)")
            subprocess.run([sys.executable, str(REPO / "images/build.py"), "--tiers", tier], check=True)
            _checked.add(tier)
        if not image_exists(reference):
            raise RuntimeError(f"images/build.py --tiers {tier} ran but {reference} is not in the local storage")
        return reference


def image_rootfs(tier: str, dest: Path) -> Path:
    """Unpack `tier`'s image root filesystem into `dest` (created; must not exist) and return it."""
    reference = built_image(tier)
    dest.mkdir(parents=True)
    container = subprocess.run(
        ["podman", *STORAGE, "create", reference], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        export = subprocess.Popen(["podman", *STORAGE, "export", container], stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(dest), "--numeric-owner"], stdin=export.stdout, check=True)
        if export.wait() != 0:
            raise RuntimeError(f"podman export of {reference} failed")
    finally:
        subprocess.run(["podman", *STORAGE, "rm", "-f", container], capture_output=True)
    return dest


def ulimits() -> list[str]:
    """nofile and nproc at most 1024 and never above this process's own (raising one needs CAP_SYS_RESOURCE)."""
    flags = []
    for name, limit in (("nofile", resource.RLIMIT_NOFILE), ("nproc", resource.RLIMIT_NPROC)):
        soft = resource.getrlimit(limit)[0]
        value = 1024 if soft == resource.RLIM_INFINITY else min(1024, soft)
        flags += ["--ulimit", f"{name}={value}:{value}"]
    return flags


def podman_run(image: str, *args: str, options: tuple[str, ...] = (), timeout: float = 120) -> str:
    """stdout of a throw-away container of `image` without network; fails the test with its stderr."""
    command = [*PODMAN, "run", "--rm", "--network", "none", *ulimits(), *options, image, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(command)}\nexit {result.returncode}\n{result.stderr[-3000:]}"
    return result.stdout


def image_config(image: str) -> dict:
    """The image's config (User, Env, Entrypoint, Labels) as podman reads it."""
    out = subprocess.run([*PODMAN, "image", "inspect", image], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)[0]["Config"]


def can_build() -> str | None:
    """Why this process cannot build images (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "building images (debootstrap, buildah with vfs storage) needs root"
    return None
