"""Container images for the node agent. An image in local containers storage runs from its own root
filesystem (image_store.py); for the others, the project's virtual environment stands in for every image that
one of the project's Dockerfiles builds. What the image would give the container is read from its
Dockerfile (its tag from the `docker build ... -t IMAGE` line, ENV, ENTRYPOINT, CMD, USER, a base it is
built FROM), and the executables a command names are looked up where the image would have them: the
image's Python (/usr/local/bin/python, `python`, `python3`) is the venv's interpreter and its console
scripts (`kuberl`, `torchrun`) are the venv's; anything else must be on the slim Debian base's PATH.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from helpers.dockerfile import instructions

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # python:3.11-slim's PATH
PYTHONS = {"python", "python3", "python3.11", "/usr/local/bin/python", "/usr/local/bin/python3"}


@dataclass
class Image:
    name: str  # without the tag
    dockerfile: Path | None  # None: an image from local containers storage (image_store.py)
    env: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    user: str | None = None
    rootfs: Path | None = None  # the image's root filesystem; None: the checkout stands in for it
    workdir: str | None = None


class ImageNotFound(LookupError):
    """No Dockerfile of the project builds this image (the kubelet's ErrImagePull)."""


class ExecutableNotFound(LookupError):
    """The command names an executable the image does not have (the runtime's StartError)."""


def _exec_form(rest: str) -> list[str]:
    return json.loads(rest) if rest.startswith("[") else ["/bin/sh", "-c", rest]


def _env(rest: str) -> dict[str, str]:
    pairs = re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', rest)
    return {k: v.strip('"') for k, v in pairs}


def project_images(repo: Path = REPO) -> dict[str, Image]:
    """Every image the project's Dockerfiles build, by name without the tag."""
    dockerfiles = sorted(p for p in repo.rglob("Dockerfile") if ".venv" not in p.parts)
    tags: dict[str, Path] = {}
    for path in dockerfiles:
        if match := re.search(r"docker build .*-t (\S+)", path.read_text()):
            tags[match.group(1).rsplit(":", 1)[0]] = path
    images: dict[str, Image] = {}

    def load(name: str) -> Image:
        if name in images:
            return images[name]
        path = tags[name]
        image = Image(name, path)
        args: dict[str, str] = {}
        for keyword, rest in instructions(path):
            if keyword == "ARG" and "=" in rest:
                key, value = rest.split("=", 1)
                args[key] = value
            elif keyword == "FROM":
                base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), rest.split()[0]).rsplit(":", 1)[0]
                if base in tags:  # built on another project image: everything of it is inherited
                    parent = load(base)
                    image = Image(name, path, dict(parent.env), parent.entrypoint, parent.cmd, parent.user)
                else:  # a new stage from a public base: nothing of an earlier stage carries over
                    image = Image(name, path)
            elif keyword == "ENV":
                image.env.update(_env(rest))
            elif keyword == "ENTRYPOINT":
                image.entrypoint, image.cmd = _exec_form(rest), []
            elif keyword == "CMD":
                image.cmd = _exec_form(rest)
            elif keyword == "USER":
                image.user = rest
        images[name] = image
        return image

    for name in tags:
        load(name)
    return images


def find_image(reference: str, images: dict[str, Image]) -> Image:
    name = reference.split("@", 1)[0]
    if ":" in name.rsplit("/", 1)[-1]:
        name = name.rsplit(":", 1)[0]
    if name not in images:
        raise ImageNotFound(f"{reference}: not found (no Dockerfile of the project builds it)")
    return images[name]


def container_argv(container: dict, image: Image) -> list[str]:
    """What the runtime runs: command (or ENTRYPOINT) then args (or, without a command, CMD)."""
    command = container.get("command") or image.entrypoint
    args = container.get("args")
    if args is None:
        args = [] if container.get("command") else image.cmd
    return [*command, *args]


def resolve_executable(name: str) -> str:
    """The file that stands in for `name` in the image: the venv's for Python and its console scripts."""
    if name in PYTHONS:
        return sys.executable
    if "/" in name:
        if Path(name).exists():
            return name
        raise ExecutableNotFound(f'exec: "{name}": no such file or directory')
    if (VENV_BIN / name).exists():
        return str(VENV_BIN / name)
    if found := shutil.which(name, path=BASE_PATH):
        return found
    raise ExecutableNotFound(f'exec: "{name}": executable file not found in $PATH')
