"""Make the sandbox server's portable bundle (kuberl/portable_server.py): run at image build time, in the sandbox
image, by its own python3. Self-contained: the standard library only (no kuberl import; the bundle's paths are
passed as arguments by the Dockerfile).

    python3 portable_bundle.py --venv /opt/kuberl --dest /opt/kuberl-portable --mount /kuberl

The bundle holds the interpreter, its standard library (without tests, IDLE, Tk and Debian's sitecustomize link
into /etc), the venv's site-packages (without pip), the tools the server runs, and the `ldd` closure of all of
them with the dynamic loader. Each executable gets the bundle's loader as its ELF interpreter and the bundle's
library folder as its RPATH (patchelf), so it runs from `<mount>` in any x86-64 Linux image.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

TOOLS = ("setpriv", "nsenter", "unshare", "prlimit", "mount", "ip", "nft", "slirp4netns", "patch", "tar", "rm", "cat")
"""What kuberl_sandbox runs (tools.py names each); `cat` keeps a session's namespace holder waiting."""
LOADER = "ld-linux-x86-64.so.2"
STDLIB_LEFT_OUT = ("__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")
STDLIB_LEFT_OUT += ("sitecustomize.py", "config-3.*", "site-packages", "dist-packages")
SITE_LEFT_OUT = ("__pycache__", "pip", "pip-*", "setuptools", "setuptools-*", "_distutils_hack", "*.pth")
_LDD_LINE = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x")


def libraries(elf: Path) -> list[Path]:
    """The shared libraries `elf` loads (the whole closure, as `ldd` lists it), the loader among them."""
    done = subprocess.run(["ldd", str(elf)], capture_output=True, text=True, check=False)
    return [Path(m.group(1)) for m in map(_LDD_LINE.search, done.stdout.splitlines()) if m]


def is_elf(path: Path) -> bool:
    with path.open("rb") as file:
        return file.read(4) == b"\x7fELF"


def copy_tree(source: Path, dest: Path, left_out: tuple[str, ...]) -> None:
    shutil.copytree(source, dest, symlinks=False, ignore=shutil.ignore_patterns(*left_out))


def make(venv: Path, dest: Path, mount: str) -> None:
    """Fill `dest` (made here; must not exist) with the bundle whose executables run from `mount`."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = Path(os.path.realpath(sys.executable))
    home, bin_dir, lib_dir = dest / "python", dest / "bin", dest / "lib"
    for folder in (home / "bin", bin_dir, lib_dir):
        folder.mkdir(parents=True)
    copy_tree(Path(sys.prefix, "lib", version), home / "lib" / version, STDLIB_LEFT_OUT)
    copy_tree(venv / "lib" / version / "site-packages", home / "site-packages", SITE_LEFT_OUT)
    executables = [home / "bin" / version]
    shutil.copy2(python, executables[0])
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/sbin:/usr/bin:/sbin:/bin")
        if found is None:
            raise SystemExit(f"portable bundle: no {tool} in the image (install it before this step)")
        executables.append(bin_dir / tool)
        shutil.copy2(os.path.realpath(found), executables[-1])
    shared = [p for p in home.rglob("*.so*") if p.is_file() and is_elf(p)]
    needed: dict[str, Path] = {}
    for elf in [*executables, *shared]:
        for library in libraries(elf):
            needed.setdefault(library.name, library)
    for name, library in needed.items():
        shutil.copy2(os.path.realpath(library), lib_dir / (LOADER if name.startswith("ld-linux") else name))
    for elf in executables:
        subprocess.run(
            ["patchelf", "--set-interpreter", f"{mount}/lib/{LOADER}", "--force-rpath", "--set-rpath", f"{mount}/lib",
             str(elf)],
            check=True,
        )  # fmt: skip
    os.chmod(lib_dir / LOADER, 0o755)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the server's virtual environment")
    parser.add_argument("--dest", type=Path, required=True, help="where the bundle is written (must not exist)")
    parser.add_argument("--mount", required=True, help="where the bundle runs from in a foreign image")
    args = parser.parse_args()
    make(args.venv, args.dest, args.mount)


if __name__ == "__main__":
    main()
