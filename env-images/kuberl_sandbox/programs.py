"""The programs the server itself runs, by absolute path: the machine's (found on PATH once, at import), or, in a
task's own image (KUBERL_SANDBOX_FOREIGN_IMAGE=1), the portable bundle's (kuberl/portable_server.py), so that the
server never depends on what that image has. Agent commands are another matter: they run the image's own tools."""

from __future__ import annotations

import os
import shutil

from kuberl import portable_server
from kuberl.api import env_vars


def foreign_image() -> bool:
    """Whether this server runs from the portable bundle in a task's own image."""
    return os.environ.get(env_vars.SANDBOX_FOREIGN_IMAGE, "").strip().lower() in ("1", "true", "yes")


def program(name: str, fallback: str) -> str:
    """The absolute path the server runs `name` from."""
    if foreign_image():
        return f"{portable_server.TOOLS}/{name}"
    return shutil.which(name) or fallback


BUNDLED = ("setpriv", "nsenter", "unshare", "prlimit", "mount", "ip", "nft", "slirp4netns", "patch", "tar", "rm", "cat")
"""Every program below, by name: what the portable bundle carries (images/portable_bundle.py)."""

SETPRIV = program("setpriv", "/usr/bin/setpriv")
UNSHARE = program("unshare", "/usr/bin/unshare")
NSENTER = program("nsenter", "/usr/bin/nsenter")
PRLIMIT = program("prlimit", "/usr/bin/prlimit")
IP = program("ip", "/usr/sbin/ip")
MOUNT = program("mount", "/usr/bin/mount")
NFT = program("nft", "/usr/sbin/nft")
SLIRP4NETNS = program("slirp4netns", "/usr/bin/slirp4netns")
PATCH = program("patch", "/usr/bin/patch")
TAR = program("tar", "/bin/tar")
RM = program("rm", "/bin/rm")
CAT = program("cat", "/bin/cat")
