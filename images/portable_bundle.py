"""Make the sandbox server's portable bundle (kuberl/portable_server.py): run at image build time, in the sandbox
image, by the server's own virtual environment (the tools to carry and the paths come from the installed kuberl):

    /opt/kuberl/bin/python portable_bundle.py --venv /opt/kuberl

The bundle holds the interpreter, its standard library (without tests, IDLE, Tk and Debian's sitecustomize link
into /etc), the venv's site-packages (without pip), the tools the server runs (kuberl_sandbox.programs), and the
`ldd` closure of all of them with the dynamic loader. Each executable gets the bundle's loader as its ELF
interpreter and the bundle's library folder as its RPATH (patchelf), so it runs from PORTABLE_MOUNT in any x86-64
Linux image.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

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


def make(venv: Path, dest: Path, mount: str, tools: tuple[str, ...]) -> None:
    """Fill `dest` (made here; must not exist) with the bundle whose executables run from `mount`."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    python = Path(os.path.realpath(sys.executable))  # the venv's python links to the system's
    home, bin_dir, lib_dir = dest / "python", dest / "bin", dest / "lib"
    for folder in (home / "bin", bin_dir, lib_dir):
        folder.mkdir(parents=True)
    copy_tree(Path(sys.base_prefix, "lib", version), home / "lib" / version, STDLIB_LEFT_OUT)
    copy_tree(venv / "lib" / version / "site-packages", home / "site-packages", SITE_LEFT_OUT)
    executables = [home / "bin" / version]
    shutil.copy2(python, executables[0])
    for tool in tools:
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
    from kuberl import portable_server
    from kuberl_sandbox.programs import BUNDLED

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, required=True, help="the server's virtual environment")
    parser.add_argument("--dest", type=Path, default=Path(portable_server.BUNDLE_IN_SANDBOX_IMAGE))
    parser.add_argument("--mount", default=portable_server.PORTABLE_MOUNT, help="where the bundle runs from")
    args = parser.parse_args()
    make(args.venv, args.dest, args.mount, BUNDLED)


if __name__ == "__main__":
    main()
