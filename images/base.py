"""The Debian bookworm base every KubeRL image builds FROM: a `debootstrap --variant=minbase` root filesystem
with Debian's python3 (plus venv/pip) and the bookworm security updates, committed with buildah. It is built
once per set of inputs and reused: its tag carries a digest of them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tempfile
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
# python3-venv: the images keep their packages in a virtual environment (/opt/kuberl), out of Debian's way;
# ca-certificates: pip reaches PyPI over TLS while the images are built.
PACKAGES = ("python3", "python3-venv", "ca-certificates")
REPOSITORY = "localhost/kuberl/base"
STORAGE = ["--storage-driver", "vfs"]
SOURCES = f"""\
deb {MIRROR} {SUITE} main
deb {MIRROR} {SUITE}-updates main
deb {SECURITY_MIRROR} {SUITE}-security main
"""


def inputs_digest() -> str:
    """A digest of what the base is made of: the suite, mirrors, packages and this file's text."""
    recipe = {"suite": SUITE, "packages": PACKAGES, "sources": SOURCES, "code": Path(__file__).read_text()}
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def reference() -> str:
    """The tag of the base for the current inputs, e.g. localhost/kuberl/base:bookworm-1a2b3c4d5e6f."""
    return f"{REPOSITORY}:{SUITE}-{inputs_digest()}"


def exists(image: str) -> bool:
    """Whether the local storage holds `image`."""
    inspect = subprocess.run(["buildah", *STORAGE, "inspect", "--type", "image", image], capture_output=True)
    return inspect.returncode == 0


def ensure(log=print) -> str:
    """The base's reference, built first when the storage lacks it; also tagged `<REPOSITORY>:<SUITE>`, the
    default of the Dockerfiles' `ARG BASE`."""
    image = reference()
    if exists(image):
        log(f"base: reusing {image}")
    else:
        log(f"base: building {image} (debootstrap {SUITE}, {', '.join(PACKAGES)})")
        with tempfile.TemporaryDirectory(prefix="kuberl-base-", dir="/var/tmp") as tmp:
            rootfs = Path(tmp) / "rootfs"
            _bootstrap(rootfs)
            _commit(rootfs, image)
        _remove_stale(image)
    subprocess.run(["buildah", *STORAGE, "tag", image, f"{REPOSITORY}:{SUITE}"], check=True, capture_output=True)
    return image


def _remove_stale(current: str) -> None:
    """Untag the bases of earlier inputs (a tier image built on one keeps its layers)."""
    listing = subprocess.run(
        ["buildah", *STORAGE, "images", "--format", "{{.Name}}:{{.Tag}}", REPOSITORY],
        capture_output=True,
        text=True,
    )
    for image in listing.stdout.split():
        if image.startswith(f"{REPOSITORY}:{SUITE}-") and image != current:
            subprocess.run(["buildah", *STORAGE, "rmi", image], capture_output=True)


def _bootstrap(rootfs: Path) -> None:
    """debootstrap, then the security and point-release updates, then apt's caches and lists removed."""
    subprocess.run(
        ["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(rootfs), MIRROR],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    (rootfs / "etc/apt/sources.list").write_text(SOURCES)
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for command in (["apt-get", "update", "-qq"], ["apt-get", "dist-upgrade", "-y", "-qq"], ["apt-get", "clean"]):
        subprocess.run(["chroot", str(rootfs), *command], check=True, env=env, stdout=subprocess.DEVNULL)
    for cache in ("var/lib/apt/lists", "var/cache/apt", "var/log"):
        for entry in (rootfs / cache).rglob("*"):
            if entry.is_file() and entry.name != "lock":
                entry.unlink()


def _commit(rootfs: Path, image: str) -> None:
    container = subprocess.run(
        ["buildah", *STORAGE, "from", "scratch"], check=True, capture_output=True, text=True
    ).stdout.strip()
    try:
        subprocess.run(["buildah", *STORAGE, "copy", "--quiet", container, f"{rootfs}/", "/"], check=True)
        subprocess.run(
            [
                "buildah", *STORAGE, "config",
                "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--env", "LANG=C.UTF-8",
                "--cmd", "/bin/bash",
                "--label", f"io.kuberl.base.inputs={inputs_digest()}",
                container,
            ],
            check=True,
        )  # fmt: skip
        subprocess.run(["buildah", *STORAGE, "commit", "--quiet", "--rm", container, image], check=True)
    except BaseException:
        subprocess.run(["buildah", *STORAGE, "rm", container], capture_output=True)
        raise
