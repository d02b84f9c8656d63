"""Environments of SWE-bench-format instances: one virtualenv per repository, environment commit and install
recipe, built once ahead of time (`kuberl tasks prepare`) and shared read-only by every session that uses it.

How an instance's environment is made, in order: its own `install_config` (SWE-rebench-V2 style), else the
specs of an installed `swebench` package that still ships them (4.x: `MAP_REPO_VERSION_TO_SPECS`) for its repo
and version, else the default: pytest and the repository's own dependencies (`pip install .`, then the
project itself uninstalled, so that the code under test is always the workspace's and the environment holds
no copy of the repository's source for the agent to read). A recipe that installs with its own commands
keeps the environment commit's checkout beside the venv (an editable install needs it), readable by sessions.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kuberl.api.swebench import SWEBenchInstance
from kuberl.swebench.mirror import commit_tree

READY = "environment.json"
"""Written last, when the environment works: its recipe, Python and installed packages."""
DEFAULT_PACKAGES = ("pytest==9.2.0",)
PREPARE_TIMEOUT_S = 1800


class EnvironmentProblem(RuntimeError):
    """An environment that cannot be built or used, said in one line that names it."""


@dataclass(frozen=True)
class EnvironmentRecipe:
    """Everything that decides what an environment holds; equal recipes share one environment."""

    repo: str
    commit: str
    python: str | None = None
    """A version such as "3.11"; None: the machine's python3."""
    pip_packages: tuple[str, ...] = DEFAULT_PACKAGES
    install: tuple[str, ...] = ()
    """Commands run in the checkout; empty: the default install (dependencies only)."""
    source: str = "default"
    """Where the recipe came from: install_config, swebench-specs or default."""

    @property
    def key(self) -> str:
        content = {k: v for k, v in asdict(self).items() if k != "source"}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:20]


def recipe_for(instance: SWEBenchInstance) -> EnvironmentRecipe:
    """The recipe of an instance's environment: install_config, else swebench's specs, else the default."""
    config = instance.install_config
    if config is not None:
        return EnvironmentRecipe(
            repo=instance.repo,
            commit=instance.environment_commit,
            python=config.python,
            pip_packages=tuple(config.packages()) or DEFAULT_PACKAGES,
            install=tuple(config.commands()),
            source="install_config",
        )
    if (specs := _swebench_specs(instance.repo, instance.version)) is not None:
        packages = specs.get("pip_packages") or []
        install = specs.get("install")
        return EnvironmentRecipe(
            repo=instance.repo,
            commit=instance.environment_commit,
            python=str(specs["python"]) if specs.get("python") else None,
            pip_packages=tuple([*packages, *DEFAULT_PACKAGES]),
            install=(install,) if isinstance(install, str) else tuple(install or ()),
            source="swebench-specs",
        )
    return EnvironmentRecipe(repo=instance.repo, commit=instance.environment_commit)


def _swebench_specs(repo: str, version: str | None) -> dict[str, object] | None:
    try:  # swebench 4.x shipped per-repo specs; 5.x moved them into its task folders and images
        from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS  # type: ignore[import-not-found]
    except ImportError:
        return None
    specs = MAP_REPO_VERSION_TO_SPECS.get(repo, {}).get(version or "")
    return dict(specs) if isinstance(specs, dict) else None


@dataclass(frozen=True)
class Environment:
    """A prepared environment: its folder, the venv's python, and what `environment.json` says."""

    folder: Path
    key: str
    details: dict[str, object] = field(default_factory=dict)

    @property
    def python(self) -> Path:
        return self.folder / "venv" / "bin" / "python"

    @property
    def bin(self) -> Path:
        return self.folder / "venv" / "bin"


def find(root: Path, key: str) -> Environment | None:
    """The prepared environment `key` under `root`, or None when it was never finished."""
    folder = root / key
    try:
        details = json.loads((folder / READY).read_text())
    except (OSError, ValueError):
        return None
    environment = Environment(folder, key, details)
    return environment if environment.python.exists() else None


SYSTEM_BIN = ("/usr/local/bin", "/usr/bin")
"""Where an interpreter every session user can run lives (a per-user install, pyenv's say, is not readable)."""


def python_for(version: str | None) -> str:
    """The system interpreter a venv of `version` is made from; EnvironmentProblem when this machine lacks it."""
    name = "python3" if version is None else "python" + ".".join(version.split(".")[:2])
    for folder in SYSTEM_BIN:
        if os.access(f"{folder}/{name}", os.X_OK):
            return f"{folder}/{name}"
    raise EnvironmentProblem(f"needs {name}, which this machine lacks (not in {' or '.join(SYSTEM_BIN)})")


def prepare(
    recipe: EnvironmentRecipe, mirror: Path, root: Path, log: Callable[[str], None] = lambda line: None
) -> Environment:
    """Build the recipe's environment under `root` unless it is there already; idempotent, atomic (a folder
    renamed into place once it works), and readable but not writable by other users."""
    if (existing := find(root, recipe.key)) is not None:
        return existing
    interpreter = python_for(recipe.python)
    tree = commit_tree(mirror, root / ".archives", recipe.repo, recipe.commit)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o755)
    building = Path(tempfile.mkdtemp(dir=root, prefix=f".{recipe.key}."))
    started = time.monotonic()
    try:
        checkout = building / "src"
        checkout.mkdir()
        with tarfile.open(tree.archive) as tar:
            tar.extractall(checkout, filter="data")
        _run([interpreter, "-m", "venv", str(building / "venv")], building, log)
        python = str(building / "venv" / "bin" / "python")
        env = {**os.environ, "VIRTUAL_ENV": str(building / "venv"), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        env["PATH"] = f"{building / 'venv' / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
        env.pop("PYTHONPATH", None)
        if recipe.pip_packages:
            _run([python, "-m", "pip", "install", "-q", *recipe.pip_packages], checkout, log, env)
        if recipe.install:
            for command in recipe.install:
                _run(["/bin/sh", "-c", command], checkout, log, env)
        else:
            _install_dependencies_only(python, checkout, building, log, env)
            shutil.rmtree(checkout)
        frozen = _run([python, "-m", "pip", "freeze", "--all"], building, log, env).splitlines()
        details = {
            "recipe": asdict(recipe),
            "key": recipe.key,
            "python": _run([python, "-c", "import sys; print(sys.version.split()[0])"], building, log, env).strip(),
            "packages": frozen,
            "seconds": round(time.monotonic() - started, 1),
        }
        (building / READY).write_text(json.dumps(details, indent=2) + "\n")
        _world_readable(building)
        os.replace(building, root / recipe.key)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    environment = find(root, recipe.key)
    assert environment is not None
    return environment


def _install_dependencies_only(
    python: str, checkout: Path, building: Path, log: Callable[[str], None], env: dict[str, str]
) -> None:
    report = building / "install-report.json"
    _run([python, "-m", "pip", "install", "-q", "--report", str(report), "."], checkout, log, env)
    own = [
        item["metadata"]["name"]
        for item in json.loads(report.read_text()).get("install", [])
        if str(item.get("download_info", {}).get("url", "")).startswith("file:")
    ]
    report.unlink()
    if own:
        _run([python, "-m", "pip", "uninstall", "-y", "-q", *own], checkout, log, env)


def _run(argv: list[str], cwd: Path, log: Callable[[str], None], env: dict[str, str] | None = None) -> str:
    log(" ".join(argv[:6]))
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=PREPARE_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise EnvironmentProblem(f"{' '.join(argv[:4])}: still running after {PREPARE_TIMEOUT_S} s") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EnvironmentProblem(f"{' '.join(argv[:5])} failed ({done.returncode}): {' | '.join(tail)}")
    return done.stdout


def _world_readable(folder: Path) -> None:
    for path, _dirs, files in os.walk(folder):
        os.chmod(path, 0o755)
        for name in files:
            target = Path(path) / name
            if not target.is_symlink():
                target.chmod(target.stat().st_mode | 0o444)
