"""Repository tasks in the task's own image (KUBERL_SANDBOX_FOREIGN_IMAGE=1: the server runs from its portable
bundle inside, say, a SWE-bench instance image). The image is the base commit: the repository at the task's
`workdir` is what a session's workspace starts as (a copy, the session's own) and what scoring resets files to;
commands and tests run the image's own environment (its PATH, the Python first on it). No mirror, no prepared
environment.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kuberl_sandbox import workspace as ws
from kuberl_sandbox.programs import SETPRIV, TAR, UNSHARE
from kuberl_sandbox.rights import Owner

SHELL = "/bin/sh"
"""What every agent command runs through: the image's own shell."""
LISTING_LEFT_OUT = (".git",)
"""Not part of the base commit's tree (the history stays in the workspace copy, as the image has it)."""
_READ_LIMIT = 64 << 20


@dataclass(frozen=True)
class ImageTree:
    """The base commit as the image holds it: the regular files under `folder` (links not followed)."""

    folder: Path
    files: tuple[str, ...]

    def read_many(self, paths: list[str]) -> dict[str, bytes | None]:
        """The content of each path, or None where the image has no such regular file."""
        present = set(self.files)
        return {p: ws.read_bytes(self.folder, p, _READ_LIMIT, None)[0] if p in present else None for p in paths}


@functools.lru_cache(maxsize=64)
def image_tree(workdir: str) -> ImageTree:
    """The files of the repository at `workdir`, listed once (the image does not change under the server)."""
    folder, files = Path(workdir), []
    for parent, folders, names in os.walk(folder, followlinks=False):
        if parent == workdir:
            folders[:] = [f for f in folders if f not in LISTING_LEFT_OUT]
        relative = Path(parent).relative_to(folder)
        files += [str(relative / n) if str(relative) != "." else n for n in names if (Path(parent) / n).is_file()
                  and not (Path(parent) / n).is_symlink()]  # fmt: skip
    return ImageTree(folder, tuple(sorted(files)))


def missing_workdir(workdir: str) -> str | None:
    """Why a session cannot start from `workdir` (one line), or None."""
    if not os.path.isabs(workdir) or not os.path.isdir(workdir) or os.path.islink(workdir):
        return (
            f"this image has no repository folder at {workdir} (the task's workdir): build the task's image with "
            "the repository there, or set the task's workdir to where the image keeps it"
        )
    return None


def image_python() -> str:
    """The interpreter the image's tests run under: the first python on the image's PATH."""
    path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
    return shutil.which("python", path=path) or shutil.which("python3", path=path) or "python"


def copy_workdir(folder: Path, workspace: Path, owner: Owner | None) -> None:
    """Copy the image's repository into the new, empty workspace: GNU tar reads it as the server (links archived
    as links, never followed) and a second tar, run as the session's user, writes it (nothing that user could not
    write). Numeric owners: no name lookup, which could load the image's NSS modules into the bundle's tar. The
    workspace stays 0700, the session's."""
    user = [] if owner is None else [SETPRIV, f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"]
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    with tempfile.TemporaryFile() as errors:
        reader = subprocess.Popen(
            [TAR, "-c", "--numeric-owner", "-f", "-", "-C", str(folder), "."],
            stdout=subprocess.PIPE,
            stderr=errors,
            env=env,
        )
        assert reader.stdout is not None
        with reader.stdout:
            done = subprocess.run(
                [*user, TAR, "-x", "--no-same-owner", "-f", "-", "-C", str(workspace)],
                stdin=reader.stdout,
                capture_output=True,
                env=env,
                check=False,
            )
        read = reader.wait()
        errors.seek(0)
        why = (done.stderr + errors.read()).decode(errors="replace").strip()
    if done.returncode != 0 or read != 0:
        raise ws.WorkspaceError(f"cannot copy the repository at {folder}: {why[:300]}")
    os.chmod(workspace, 0o700)


def shell_problem(shell: str = SHELL) -> str | None:
    """Why agent commands cannot run in this image (one line), or None: its shell must exist and run."""
    try:
        done = subprocess.run([shell, "-c", "exit 0"], capture_output=True, timeout=10, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as err:
        why = f"{shell} does not run ({err.strerror or err})" if isinstance(err, OSError) else f"{shell}: {err}"
    else:
        if done.returncode == 0:
            return None
        why = f"{shell} -c 'exit 0' failed with exit {done.returncode}: {done.stderr.decode(errors='replace')[:200]}"
    return (
        f"sandbox: this image cannot run agent commands: {' '.join(why.split())}. A task's image needs a POSIX "
        f"shell at {shell} with the libc it links to (docs/images.md, Tasks in their own images)."
    )


def bundle_problem() -> str | None:
    """Why the portable bundle's tools cannot serve (one line), or None."""
    if os.access(UNSHARE, os.X_OK):
        return None
    return (
        f"sandbox: the portable server's tools are not there ({UNSHARE}): mount the bundle with an init container "
        "of the sandbox image running kuberl.portable_server.install_argv()"
    )
