"""Images in local containers storage (buildah, vfs driver) for the node agent: an image's configuration
(Env, Entrypoint, Cmd, User, WorkingDir) as the image records it, and its root filesystem, prepared once
per image id and kept as a buildah working container named `kuberl-rootfs-<id>` (later runs find it there;
those of images no name points at any more are removed).
Containers never write to it: container_init.py lays a fresh writable layer over it (overlayfs).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

from cluster.images import BASE_PATH, Image

STORAGE = ("--storage-driver", "vfs")
PREFIX = "kuberl-rootfs-"  # the working containers that hold prepared root filesystems
LOCK_FILE = Path("/var/tmp/kuberl-rootfs.lock")
_lock = threading.Lock()


class ImageStoreError(RuntimeError):
    """buildah failed on an image that is in local storage."""


def buildah(*args: str) -> str:
    result = subprocess.run(["buildah", *STORAGE, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ImageStoreError(f"buildah {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


def inspect(reference: str) -> dict | None:
    """`buildah inspect` of a local image; None when buildah is missing or the image is not in local storage."""
    if shutil.which("buildah") is None:
        return None
    try:
        return json.loads(buildah("inspect", "--type", "image", reference))
    except ImageStoreError:
        return None


@contextlib.contextmanager
def _exclusive() -> Iterator[None]:
    """One preparation at a time, across threads and processes (two test runs share the storage)."""
    with _lock, LOCK_FILE.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def rootfs(reference: str, image_id: str) -> Path:
    """The image's root filesystem, made (a vfs copy of its layers) on first use of this image id."""
    name = f"{PREFIX}{image_id[:16]}"
    with _exclusive():
        try:
            path = buildah("mount", name).strip()
        except ImageStoreError:
            prune()
            buildah("from", "--pull=never", "--name", name, reference)
            path = buildah("mount", name).strip()
    return Path(path)


def prune() -> None:
    """Remove the root filesystems of images no name points at any more (rebuilt under the same tag):
    each is a full copy of its image."""
    # `images --json` gives short ids, `containers --json` full ones
    images = json.loads(buildah("images", "--json") or "null") or []  # none: `null`
    named = {image["id"][:12] for image in images if image.get("names")}
    for container in json.loads(buildah("containers", "--json") or "null") or []:
        if container["containername"].startswith(PREFIX) and container["imageid"][:12] not in named:
            buildah("rm", container["id"])


def _entries(rootfs_dir: Path, table: str) -> list[list[str]]:
    try:
        return [line.split(":") for line in (rootfs_dir / "etc" / table).read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _lookup(rootfs_dir: Path, table: str, name: str) -> list[str]:
    """A user's or group's entry in the image's /etc/passwd or /etc/group, by name or number."""
    key = 2 if name.isdigit() else 0
    for fields in _entries(rootfs_dir, table):
        if len(fields) > 3 and fields[key] == name:
            return fields
    if name.isdigit():
        return [name, "x", name, "0"]  # a uid the image does not list: group 0, as runc gives it
    raise ValueError(f"image user {name!r}: not in the image's /etc/{table}")


def numeric_user(rootfs_dir: Path, user: str) -> str:
    """USER as `uid:gid` numbers, names looked up in the image; without a group, the user's own."""
    name, _, group = (user or "0").partition(":")
    entry = _lookup(rootfs_dir, "passwd", name)
    gid = (group if group.isdigit() else _lookup(rootfs_dir, "group", group)[2]) if group else entry[3]
    return f"{entry[2]}:{gid}"


def stored_image(reference: str) -> Image | None:
    """The image as a node would run it, or None when it is not in local containers storage."""
    info = inspect(reference)
    if info is None:
        return None
    config = (info.get("OCIv1") or {}).get("config") or {}
    root = rootfs(reference, info["FromImageID"])
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    env.setdefault("PATH", BASE_PATH)
    return Image(
        name=reference,
        dockerfile=None,
        env=env,
        entrypoint=list(config.get("Entrypoint") or []),
        cmd=list(config.get("Cmd") or []),
        user=numeric_user(root, config.get("User") or ""),
        rootfs=root,
        workdir=config.get("WorkingDir") or None,
    )


def built_or_none(tier: str) -> str | None:
    """`tier`'s real image (tests/helpers/built_images.py builds it once), or None where this machine lacks
    the image tools: the checkout then stands in for it."""
    from helpers.built_images import built_image, missing_tools

    return None if missing_tools() else built_image(tier)
