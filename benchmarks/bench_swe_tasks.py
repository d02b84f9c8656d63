"""SWE-bench-format tasks on real repositories: episode start, scoring overhead, and the task factory's rate.

- Episode start: a sandbox session made ready at `base_commit` with its environment attached (the sandbox's
  own `SessionManager.create`, in process, isolated when run as root), on sympy 1.13.3's source distribution
  (1,982 files, 35 MB) committed into a mirror; the first start builds the commit's archive, the next
  `STARTS` reuse it (p50/p99). Measured with the sandbox root in memory (tmpfs, as `kuberl run` places it for
  these jobs) and on disk. Goal: p50 under 1 s.
- Scoring overhead: `submit` on a hand-written semver instance (the test patch applied to a cleaned scratch
  copy, pytest under the recorder) against the same pytest command run directly in a checkout with the test
  patch applied, outside the sandbox; the medians of `ROUNDS` alternating runs. Goal: under 1 s.
- Factory: `kuberl tasks make` on two packages, instances per minute (environments prepared in the run).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tests"))

from helpers.swe_repos import GIT_ENV, make_dataset  # noqa: E402 (a test helper: the hand-written dataset)

from kuberl.api.swebench import SWEBenchInstance  # noqa: E402
from kuberl.swebench import pytest_report  # noqa: E402
from kuberl.swebench.environments import prepare, recipe_for  # noqa: E402
from kuberl.swebench.instances import instance_task, load_instances  # noqa: E402
from kuberl_app.one_machine.processes import MEMORY_SCRATCH  # noqa: E402
from kuberl_app.one_machine.task_check import sandbox_settings  # noqa: E402
from kuberl_sandbox.metrics import SandboxMetrics  # noqa: E402
from kuberl_sandbox.session_manager import SessionManager  # noqa: E402

BIG_PACKAGE = "sympy==1.13.3"
STARTS = int(os.environ.get("KUBERL_BENCH_STARTS", "40"))
ROUNDS = int(os.environ.get("KUBERL_BENCH_SCORING_ROUNDS", "7"))
FACTORY_PACKAGES = ("inflection==0.5.1", "toolz==1.0.0")
FACTORY_PER_PACKAGE = 6


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _reachable(prefix: str) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    os.chmod(folder, 0o711)
    return folder


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], env={**os.environ, **GIT_ENV}, capture_output=True, text=True
    )
    done.check_returncode()
    return done.stdout


def big_repository(work: Path) -> tuple[Path, SWEBenchInstance, int]:
    """sympy's sdist committed into a mirror, and an instance on it (an environment with pytest only)."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", BIG_PACKAGE, "-d", work],
        check=True,
        capture_output=True,
    )
    (archive,) = work.glob("sympy-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(work, filter="data")
    mirror = work / "mirror"
    repo = mirror / "sympy__sympy"
    shutil.move(str(next(work.glob("sympy-*/"))), repo)
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "sympy")
    files = len(_git(repo, "ls-files").splitlines())
    instance = SWEBenchInstance.model_validate(
        {
            "instance_id": "sympy__sympy-1",
            "repo": "sympy/sympy",
            "base_commit": _git(repo, "rev-parse", "HEAD").strip(),
            "test_patch": "diff --git a/x b/x\n",
            "problem_statement": "episode start only",
            "FAIL_TO_PASS": ["sympy/core/tests/test_basic.py::test__aresame"],
            "install_config": {"pip_packages": ["pytest==9.2.0", "mpmath==1.3.0"], "install": ["true"]},
        }
    )
    return mirror, instance, files


async def episode_start(work: Path) -> dict[str, object]:
    """Starts with the sandbox root in memory (tmpfs: where `kuberl run` puts it for these jobs) and on disk."""
    mirror, instance, files = big_repository(work)
    environments = work / "environments"
    prepare(recipe_for(instance), mirror, environments)
    memory = Path(tempfile.mkdtemp(prefix="kuberl-bench-swe-", dir=MEMORY_SCRATCH))
    os.chmod(memory, 0o711)
    try:
        in_memory = await _starts(memory / "sandbox", mirror, environments, instance)
    finally:
        shutil.rmtree(memory, ignore_errors=True)
    on_disk = await _starts(work / "sandbox", mirror, environments, instance)
    return {"repository": BIG_PACKAGE, "files": files, **in_memory, "on_disk": on_disk}


async def _starts(root: Path, mirror: Path, environments: Path, instance: SWEBenchInstance) -> dict[str, object]:
    manager = SessionManager(sandbox_settings(root, mirror, environments), SandboxMetrics())
    manager.prepare()
    task = instance_task(instance)
    seconds: list[float] = []
    for _ in range(STARTS + 1):
        started = time.perf_counter()
        session = await manager.create(task)
        seconds.append(time.perf_counter() - started)
        await manager.close(session.session_id)
    warm = seconds[1:]
    return {
        "root": str(root.parent.parent),
        "isolated": manager.isolated,
        "first_start_s": round(seconds[0], 3),
        "p50_s": round(statistics.median(warm), 3),
        "p99_s": round(quantile(warm, 0.99), 3),
        "starts": len(warm),
    }


async def scoring_overhead(work: Path) -> dict[str, object]:
    data = make_dataset(work / "semver")
    instance = load_instances(data.instances)[0]
    environments = work / "semver-environments"
    environment = prepare(recipe_for(instance), data.mirror, environments)
    manager = SessionManager(sandbox_settings(work / "semver-sandbox", data.mirror, environments), SandboxMetrics())
    manager.prepare()
    checkout = work / "semver-checkout"
    checkout.mkdir()
    tree = work / "semver-base.tar"
    _git(data.mirror / "python-semver__python-semver", "archive", "--format=tar", "-o", str(tree), instance.base_commit)
    subprocess.run(["tar", "-x", "-f", str(tree), "-C", str(checkout)], check=True)
    subprocess.run(["git", "apply", "-"], cwd=checkout, input=instance.test_patch.encode(), check=True)
    task = instance_task(instance)
    files = task.repository.test_files  # type: ignore[union-attr]
    direct = [environment.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", *files]
    scored, plain = [], []
    for _ in range(ROUNDS):
        session = await manager.create(task)
        started = time.perf_counter()
        outcome = await manager.run_tests(session, hidden=True)
        scored.append(time.perf_counter() - started)
        await manager.close(session.session_id)
        assert outcome.resolution is not None and not outcome.resolution.resolved
        started = time.perf_counter()
        subprocess.run(direct, cwd=checkout, capture_output=True, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "src"})
        plain.append(time.perf_counter() - started)
    return {
        "instance": instance.instance_id,
        "score_s": round(statistics.median(scored), 3),
        "tests_alone_s": round(statistics.median(plain), 3),
        "overhead_s": round(statistics.median(scored) - statistics.median(plain), 3),
        "rounds": ROUNDS,
        "runner": pytest_report.__name__,
    }


def factory_rate(work: Path) -> dict[str, object]:
    from kuberl.swebench.factory import make_instances

    started = time.perf_counter()
    report = make_instances(
        list(FACTORY_PACKAGES),
        work / "factory-mirror",
        work / "factory-environments",
        work / "factory.jsonl",
        per_package=FACTORY_PER_PACKAGE,
    )
    minutes = (time.perf_counter() - started) / 60
    made = sum(1 for line in (work / "factory.jsonl").read_text().splitlines() if line.strip())
    summary = report.to_json() if hasattr(report, "to_json") else str(report)
    return {
        "packages": list(FACTORY_PACKAGES),
        "instances": made,
        "minutes": round(minutes, 2),
        "instances_per_minute": round(made / minutes, 2),
        "report": json.loads(json.dumps(summary, default=str)),
    }


def run() -> dict[str, object]:
    work = _reachable("kuberl-bench-swe-")
    try:
        return {
            "episode_start": asyncio.run(episode_start(work)),
            "scoring": asyncio.run(scoring_overhead(work)),
            "factory": factory_rate(work),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
