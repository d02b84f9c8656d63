"""Build KubeRL's images without a Docker daemon: the Dockerfiles, FROM the debootstrap base (images/base.py),
built by `buildah bud --isolation chroot` into the local container storage (vfs), tagged as the chart and the
operator name them (ghcr.io/kuberl/<tier>:<version>), optionally copied to a registry with skopeo.

    python images/build.py [--tiers operator,sandbox,learner,rollout] [--push REGISTRY/PREFIX]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import base  # images/ is a folder of scripts, not a package

REPO = Path(__file__).resolve().parents[1]
REGISTRY = "ghcr.io/kuberl"  # kuberl.api.spec.DEFAULT_IMAGE_REGISTRY; the chart's operator image too
STORAGE = base.STORAGE
# skopeo reads the same storage as buildah and podman, named in full (its default driver may differ)
STORAGE_TRANSPORT = "containers-storage:[vfs@/var/lib/containers/storage+/run/containers/storage]"
WHEELS = REPO / "images/wheels"  # copied into the learner and rollout builds (COPY images/wheels/)
CPU_TORCH = "torch==2.13.0+cpu"  # the Makefile's torch, the CPU build (not on PyPI's index: a local wheel)
IGNOREFILE = REPO / "images/dockerignore"


@dataclass(frozen=True)
class Tier:
    name: str
    dockerfile: str
    # build arguments of a CPU build (this machine's); the Dockerfiles' defaults are the CUDA build
    cpu_args: dict[str, str] = field(default_factory=dict)


TIERS = {
    tier.name: tier
    for tier in (
        Tier("operator", "operator/Dockerfile"),
        Tier("sandbox", "env-images/sandbox/Dockerfile"),
        Tier("learner", "trainer/Dockerfile", {"TORCH": CPU_TORCH}),
        Tier("rollout", "rollout-server/Dockerfile", {"TORCH": CPU_TORCH, "EXTRAS": "cpu,agents"}),
    )
}


def version() -> str:
    """The package version (kuberl.__version__ is the installed distribution's: pyproject.toml's)."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def reference(tier: str) -> str:
    return f"{REGISTRY}/{tier}:{version()}"


def revision() -> str:
    """The git commit the image is built from, with -dirty when tracked files differ from it."""
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(REPO), "diff", "--quiet", "HEAD"], capture_output=True).returncode
    return head.stdout.strip() + ("-dirty" if dirty else "")


def copied_paths(dockerfile: Path) -> list[Path]:
    """The build-context paths a Dockerfile COPYs (not those copied from a build stage)."""
    text = dockerfile.read_text().replace("\\\n", " ")
    paths = []
    for line in text.splitlines():
        words = shlex.split(line.strip(), comments=True) if line.strip() else []
        if words and words[0].upper() == "COPY" and not any(w.startswith("--from") for w in words):
            paths += [REPO / w for w in words[1:-1] if not w.startswith("--")]
    return paths


def inputs_digest(tier: Tier, build_args: dict[str, str]) -> str:
    """A digest of everything the image is made of: Dockerfile, build arguments and the copied files."""
    digest = hashlib.sha256(json.dumps(build_args, sort_keys=True).encode())
    dockerfile = REPO / tier.dockerfile
    for path in [dockerfile, *copied_paths(dockerfile)]:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for file in files:
            if "__pycache__" in file.parts or file.suffix == ".pyc":
                continue
            digest.update(str(file.relative_to(REPO)).encode() + b"\0")
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()[:16]


def image_labels(image: str) -> dict[str, str]:
    """The labels of a local image; {} when the storage lacks it."""
    out = subprocess.run(["buildah", *STORAGE, "inspect", "--type", "image", image], capture_output=True, text=True)
    return (json.loads(out.stdout)["OCIv1"]["config"].get("Labels") or {}) if out.returncode == 0 else {}


def image_id(image: str) -> str | None:
    """The image's id in the local storage; None when the storage lacks it."""
    out = subprocess.run(
        ["buildah", *STORAGE, "inspect", "--type", "image", "--format", "{{.FromImageID}}", image],
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() or None if out.returncode == 0 else None


def image_size(image: str) -> int:
    """The image's size in bytes, as podman counts it (its layers, uncompressed)."""
    out = subprocess.run(["podman", *STORAGE, "image", "inspect", "--format", "{{.Size}}", image], capture_output=True)
    return int(out.stdout.strip() or 0) if out.returncode == 0 else 0


def find_links() -> list[Path]:
    """The wheel folders pip is configured with (pip.conf's find-links, PIP_FIND_LINKS)."""
    config = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    values = [line.split("=", 1)[1].strip("'") for line in config.splitlines() if "find-links=" in line]
    if os.environ.get("PIP_FIND_LINKS"):
        values.append(os.environ["PIP_FIND_LINKS"])
    return [Path(v) for value in values for v in value.split()]


def stage_wheel(requirement: str) -> None:
    """Put the wheel of `requirement` (torch==X+cpu) in images/wheels/, from a pip find-links folder or else by
    `pip download`; the CPU build is not on PyPI's index, so some wheel folder must hold it."""
    name, wanted = requirement.split("==")
    pattern = f"{name}-{wanted}-*.whl"
    if any(WHEELS.glob(pattern)):
        return
    for folder in find_links():
        for wheel in sorted(folder.glob(pattern)) if folder.is_dir() else []:
            shutil.copyfile(wheel, WHEELS / wheel.name)
            return
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "--dest", str(WHEELS), requirement]
    if subprocess.run(download).returncode != 0 or not any(WHEELS.glob(pattern)):
        raise SystemExit(
            f"no wheel for {requirement}: put {pattern} in {WHEELS} (or a pip find-links folder) and build again"
        )


def host_ca_bundle() -> Path | None:
    """The CA bundle pip uses on this machine (PIP_CERT, else Debian's), for the build's pip and apt."""
    for candidate in (os.environ.get("PIP_CERT"), "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate).resolve()
    return None


def build(tier: Tier, base_image: str, rebuild: bool = False, log=print) -> dict:
    """Build one tier's image unless the storage already holds it from the same inputs; returns what was done."""
    image = reference(tier.name)
    build_args = {"BASE": base_image, **tier.cpu_args}
    if "TORCH" in build_args:
        stage_wheel(build_args["TORCH"])
    inputs = inputs_digest(tier, build_args)
    if not rebuild and image_labels(image).get("io.kuberl.inputs") == inputs:
        log(f"{tier.name}: reusing {image} (inputs {inputs})")
        return {"image": image, "built": False, "seconds": 0.0}
    command = [
        "buildah", *STORAGE, "bud", "--isolation", "chroot", "--layers=false", "--quiet", "--format", "docker",
        "--ignorefile", str(IGNOREFILE), "-f", str(REPO / tier.dockerfile), "-t", image,
        "--label", f"io.kuberl.inputs={inputs}",
    ]  # fmt: skip
    if ca := host_ca_bundle():
        # the machine's trust store during RUN steps only (a TLS-inspecting proxy in front of PyPI, say)
        command += ["--volume", f"{ca}:/etc/ssl/certs/ca-certificates.crt:ro"]
    for key, value in {**build_args, "VERSION": version(), "REVISION": revision()}.items():
        command += ["--build-arg", f"{key}={value}"]
    log(f"{tier.name}: building {image} from {tier.dockerfile}")
    previous = image_id(image)
    started = time.monotonic()
    subprocess.run([*command, str(REPO)], check=True, stdout=subprocess.DEVNULL)
    if previous and previous != image_id(image):
        # vfs keeps whole copies: the untagged previous build would only take disk (kept while a container uses it)
        subprocess.run(["buildah", *STORAGE, "rmi", previous], capture_output=True)
    return {"image": image, "built": True, "seconds": round(time.monotonic() - started, 1)}


def push_target(prefix: str, tier: str) -> str:
    """skopeo's destination for `tier` under `prefix`: docker://PREFIX/<tier>:<version> for a registry path;
    a prefix with a local transport (oci:DIR, dir:DIR, oci-archive:DIR) gets one entry per tier in DIR."""
    transport, colon, path = prefix.partition(":")
    if colon and transport in {"oci", "dir", "oci-archive"}:
        suffix = ".tar" if transport == "oci-archive" else ""
        target = f"{transport}:{path.rstrip('/')}/{tier}-{version()}{suffix}"
        return target + (f":{REGISTRY}/{tier}:{version()}" if transport != "dir" else "")
    if "://" in prefix or prefix.startswith("/") or not prefix.strip("/"):
        raise SystemExit(f"--push {prefix!r}: give REGISTRY/PREFIX (e.g. registry.example.com/team) or oci:DIR")
    return f"docker://{prefix.rstrip('/')}/{tier}:{version()}"


def push(image: str, target: str) -> None:
    if target.split(":", 1)[0] in {"oci", "dir", "oci-archive"}:
        Path(target.split(":", 2)[1]).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["skopeo", "copy", "--quiet", f"{STORAGE_TRANSPORT}{image}", target], check=True)


def check_machine() -> None:
    """Root and the Debian tools the build runs, or a clear exit saying what to install."""
    tools = {"buildah": "buildah", "podman": "podman", "skopeo": "skopeo", "debootstrap": "debootstrap", "runc": "runc"}
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = sorted({package for tool, package in tools.items() if shutil.which(tool, path=path) is None})
    if missing:
        raise SystemExit(f"images/build.py needs {', '.join(missing)}: apt-get install -y {' '.join(missing)}")
    if os.geteuid() != 0:
        raise SystemExit("images/build.py needs root (debootstrap, and buildah's vfs storage in /var/lib/containers)")


def parse_tiers(value: str) -> list[Tier]:
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in TIERS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown tier(s) {', '.join(unknown) or '(none)'}; use {','.join(TIERS)}")
    return [TIERS[n] for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", type=parse_tiers, default=list(TIERS.values()), help=",".join(TIERS))
    parser.add_argument("--push", metavar="REGISTRY/PREFIX", help="copy each image to docker://PREFIX/<tier>:<version>")
    parser.add_argument("--print-reference", metavar="TIER", choices=list(TIERS), help="print a tier's image name")
    parser.add_argument("--rebuild", action="store_true", help="build the tiers even where a current image exists")
    parser.add_argument("--report", type=Path, help="write what was built (image, seconds, size) as JSON here")
    args = parser.parse_args(argv)
    if args.print_reference:
        print(reference(args.print_reference))
        return 0
    check_machine()
    WHEELS.mkdir(exist_ok=True)
    started = time.monotonic()
    base_was_there = base.exists(base.reference())
    base_image = base.ensure()
    seconds = round(time.monotonic() - started, 1)
    report = {"base": {"image": base_image, "built": not base_was_there, "seconds": seconds}}
    report["base"]["size_bytes"] = image_size(base_image)
    for tier in args.tiers:
        report[tier.name] = build(tier, base_image, rebuild=args.rebuild)
        report[tier.name]["size_bytes"] = image_size(report[tier.name]["image"])
        if args.push:
            target = push_target(args.push, tier.name)
            push(report[tier.name]["image"], target)
            report[tier.name]["pushed"] = target
            print(f"{tier.name}: pushed to {target}")
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
