"""Sessions on real repositories (SWE-bench-format tasks): the workspace from a commit's archive, the prepared
environment, and the scratch copy that is scored as SWE-bench's harness scores it.

Scoring, after the agent's last action, in a scratch copy made with the session's rights: links, bytecode,
`.pth` and start-up files and package metadata the agent could have planted are removed; every `conftest.py`
and the pytest configuration files are reset to the base commit (an added one is removed); the files the test
patch touches and every test file a FAIL_TO_PASS or PASS_TO_PASS id names are reset to the base commit (or
removed where the commit lacks them); the test patch is applied; then pytest runs under the environment's
isolated Python with the recorder plugin (kuberl/swebench/pytest_report.py). The test patch never enters
the workspace.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kuberl.api.swebench import RepositoryTask
from kuberl.swebench import environments
from kuberl.swebench.mirror import CommitTree, MirrorError, commit_tree
from kuberl_sandbox import hardened, image_workspace
from kuberl_sandbox import workspace as ws
from kuberl_sandbox.image_workspace import ImageTree
from kuberl_sandbox.programs import SETPRIV, TAR
from kuberl_sandbox.rights import Owner, session_rights
from kuberl_sandbox.settings import SandboxSettings

CONFIG_FILES = ("pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml")
"""Top-level files pytest reads its options from (plugins to load, paths to add): the base commit's count."""
PLANTED = (b".dist-info", b".egg-info", b".egg-link")
"""Package metadata in the workspace would register entry points (pytest plugins) from it."""
_DIFF_PATH = re.compile(r"^(?:---|\+\+\+) (?:[ab]/)?(\S+)", re.MULTILINE)


class RepositoryUnavailable(ValueError):
    """The server cannot start a session of this task: no mirror, no such commit, no prepared environment."""


@dataclass(frozen=True)
class Checkout:
    """What a session of a repository task stands on: the base commit's tree and the environment."""

    tree: CommitTree | ImageTree
    environment: environments.Environment | None
    """The prepared environment; None: the task's own image's (image_workspace.py)."""
    image_python: str = ""
    """The image's own interpreter, where `environment` is None."""

    @property
    def python(self) -> str:
        """The interpreter the tests run under."""
        return str(self.environment.python) if self.environment is not None else self.image_python

    @property
    def shared(self) -> tuple[Path, ...]:
        """Folders sessions must reach at their own paths (a prepared environment)."""
        return (self.environment.folder,) if self.environment is not None else ()

    @property
    def top_level(self) -> list[str]:
        return sorted({path.split("/", 1)[0] for path in self.tree.files})

    @property
    def source_paths(self) -> list[str]:
        from kuberl.swebench.pytest_report import source_paths

        return source_paths(list(self.tree.files))


def checkout_for(settings: SandboxSettings, task: RepositoryTask) -> Checkout:
    """The tree and environment of `task`; RepositoryUnavailable (a one-line reason) when either is missing."""
    if settings.foreign_image:
        if why := image_workspace.missing_workdir(task.workdir):
            raise RepositoryUnavailable(why)
        return Checkout(image_workspace.image_tree(task.workdir), None, image_workspace.image_python())
    if settings.repos is None or settings.environments is None:
        raise RepositoryUnavailable(
            "this sandbox server has no repository mirror or environments folder "
            "(start it with KUBERL_SANDBOX_REPOS and KUBERL_SANDBOX_ENVIRONMENTS)"
        )
    environment = environments.find(settings.environments, task.environment)
    if environment is None:
        raise RepositoryUnavailable(
            f"environment {task.environment} of {task.repo} is not prepared under {settings.environments} "
            "(run `kuberl tasks prepare` on the instance file)"
        )
    try:
        tree = commit_tree(settings.repos, settings.root / ".archives", task.repo, task.base_commit)
    except MirrorError as err:
        raise RepositoryUnavailable(str(err)) from None
    return Checkout(tree, environment)


def fill_workspace(checkout: Checkout, workspace: Path, owner: Owner | None) -> None:
    """The new session's workspace: the base commit's tree, from the mirror's archive or the image's folder."""
    if isinstance(checkout.tree, ImageTree):
        image_workspace.copy_workdir(checkout.tree.folder, workspace, owner)
    else:
        unpack(checkout.tree, workspace, owner)


def unpack(tree: CommitTree, workspace: Path, owner: Owner | None) -> None:
    """Unpack the commit's tree into the new, empty workspace: GNU tar run as the session's user (it can write
    nothing that user could not), reading the archive the server opened for it (the session cannot read it)."""
    user = [] if owner is None else [SETPRIV, f"--reuid={owner[0]}", f"--regid={owner[1]}", "--clear-groups"]
    with tree.archive.open("rb") as archive:
        done = subprocess.run(
            [*user, TAR, "-x", "--no-same-owner", "-f", "-", "-C", str(workspace)],
            stdin=archive,
            capture_output=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            check=False,
        )
    if done.returncode != 0:
        raise ws.WorkspaceError(f"cannot unpack the base commit: {done.stderr.decode(errors='replace').strip()[:300]}")


def patched_files(diff: str) -> list[str]:
    """The paths a unified diff names (before and after), without `/dev/null`."""
    return list(dict.fromkeys(p for p in _DIFF_PATH.findall(diff) if p != "/dev/null"))


def prepare_scratch(scratch: Path, task: RepositoryTask, checkout: Checkout, owner: Owner | None, limit: int) -> None:
    """Clean the scratch copy and reset what decides how the tests run (see the module's docstring)."""
    hardened.clean(scratch, [], checkout.top_level)
    planted, conftests = _planted_and_conftests(scratch, owner)
    for path in reversed(planted):
        _remove(scratch, path, owner)
    base_conftests = [f for f in checkout.tree.files if f.rsplit("/", 1)[-1] == "conftest.py"]
    reset_to_base(
        scratch,
        checkout.tree,
        [*conftests, *base_conftests, *CONFIG_FILES, *patched_files(task.test_patch), *task.test_files],
        owner,
        limit,
    )


def clean_for_visible_run(scratch: Path, checkout: Checkout, owner: Owner | None, limit: int) -> None:
    """A `run_tests` copy: planted artifacts removed and the pytest configuration reset (the tests as they are)."""
    hardened.clean(scratch, [], checkout.top_level)
    planted, conftests = _planted_and_conftests(scratch, owner)
    for path in reversed(planted):
        _remove(scratch, path, owner)
    base_conftests = [f for f in checkout.tree.files if f.rsplit("/", 1)[-1] == "conftest.py"]
    reset_to_base(scratch, checkout.tree, [*conftests, *base_conftests, *CONFIG_FILES], owner, limit)


def reset_to_base(
    scratch: Path, tree: CommitTree | ImageTree, paths: list[str], owner: Owner | None, limit: int
) -> None:
    """Each path as the base commit has it, or removed where the commit has no such file."""
    contents = tree.read_many(list(dict.fromkeys(paths)))
    for path, content in contents.items():
        if content is None:
            _remove(scratch, path, owner)
        else:
            ws.write_bytes(scratch, path, content, owner, max(limit, len(content)))


def _planted_and_conftests(scratch: Path, owner: Owner | None) -> tuple[list[str], list[str]]:
    planted, conftests = [], []
    with session_rights(owner), ws.open_folder(scratch, [], ".") as folder:
        for entry in ws.walk(folder):
            if entry.name.endswith(PLANTED):
                planted.append(os.fsdecode(entry.path))
            elif entry.name == b"conftest.py":
                conftests.append(os.fsdecode(entry.path))
    return planted, conftests


def _remove(scratch: Path, path: str, owner: Owner | None) -> None:
    """Remove a file or folder of the scratch copy, if it is there, as the session (never following links)."""
    with session_rights(owner):
        try:
            with ws.open_folder(scratch, ws.path_names(path)[:-1], path) as parent:
                name = ws.path_names(path)[-1]
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    hardened.remove_tree(parent, name)
                else:
                    os.unlink(name, dir_fd=parent)
        except (FileNotFoundError, NotADirectoryError, ws.WorkspaceError):
            return
