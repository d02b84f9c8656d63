"""How the sandbox server runs inside a task's own image (a SWE-bench instance image, built without KubeRL).

The sandbox image carries a self-contained copy of the server at BUNDLE_IN_SANDBOX_IMAGE: Python, its standard
library and the server's packages, the dynamic loader and every shared library they load, and the tools the
server runs (util-linux, iproute2, patch, tar). Each executable in it names the bundle's loader and library
folder itself (ELF interpreter and RPATH), so nothing of the foreign image's libc or Python is used by the server.

A pod runs it in two steps: an init container of the sandbox image runs `install_argv()`, which copies the
bundle onto PORTABLE_MOUNT (an emptyDir shared by both containers); the task's image then runs
`server_argv(...)` with `server_env()`, without using the image's shell. Agent commands still run the image's
own /bin/sh with the image's PATH (docs/images.md: what a foreign image must have).
"""

from __future__ import annotations

from kuberl.api.env_vars import SANDBOX_FOREIGN_IMAGE

PORTABLE_MOUNT = "/kuberl"
"""Where the bundle is mounted in the foreign pod (an emptyDir); its executables name this path."""
BUNDLE_IN_SANDBOX_IMAGE = "/opt/kuberl-portable"
"""Where the sandbox image keeps the bundle (env-images/sandbox/Dockerfile builds it)."""
PYTHON_HOME = f"{PORTABLE_MOUNT}/python"
"""The bundled interpreter's prefix: bin/python3.11 and lib/python3.11 (the standard library)."""
SITE_PACKAGES = f"{PYTHON_HOME}/site-packages"
"""The server's packages (kuberl, kuberl_sandbox and their dependencies)."""
PYTHON = f"{PYTHON_HOME}/bin/python3.11"
BUNDLE_PARTS = ("bin", "lib", "python")
"""The bundle's top-level folders (images/portable_bundle.py makes them): tools, loader and libraries, Python."""
TOOLS = f"{PORTABLE_MOUNT}/bin"
"""The tools the server runs in this mode (setpriv, nsenter, unshare, prlimit, mount, ip, patch, tar, ...)."""


def install_argv() -> list[str]:
    """The init container's command (in the KubeRL sandbox image): copy the bundle onto PORTABLE_MOUNT."""
    # Each part into the mount, not the bundle's folder onto it: the emptyDir's own folder is root's (0777) and a
    # non-root installer may fill it but not set its mode or times. Modes are kept (the executables' x bits);
    # owners and times need not be.
    parts = [f"{BUNDLE_IN_SANDBOX_IMAGE}/{part}" for part in BUNDLE_PARTS]
    return ["cp", "-R", "--preserve=mode", "--target-directory", PORTABLE_MOUNT, *parts]


def server_argv(server_args: list[str]) -> list[str]:
    """The foreign container's command: the bundled server with these `kuberl sandbox` arguments."""
    # -s: no user site of the image's; the bundle's own paths come from server_env()
    return [PYTHON, "-s", "-m", "kuberl_app.cli", "sandbox", *server_args]


def server_env() -> dict[str, str]:
    """What the foreign container's environment needs beside the server's usual KUBERL_SANDBOX_* variables.
    PATH is left as the image has it: agent commands and tests run the image's own tools. An image's LD_PRELOAD
    and LD_LIBRARY_PATH are emptied: the server loads the bundle's libraries only."""
    return {
        "LD_PRELOAD": "",
        "LD_LIBRARY_PATH": "",
        "PYTHONHOME": PYTHON_HOME,
        "PYTHONPATH": SITE_PACKAGES,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        SANDBOX_FOREIGN_IMAGE: "1",
    }
