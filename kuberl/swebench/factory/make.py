"""The task factory's driver: from pinned PyPI packages to SWE-bench-format instances with procedural bugs.

Per package: the sdist becomes a mirror repository with one pristine commit, whose environment is prepared
once; its tests run on the pristine tree (twice: a test must pass both times to be used). Then mutations, in
an order fixed by the seed, are tried in a copy of the pristine tree: one is kept when the package's own tests
catch it, not too broadly, and the made instance passes the SWE-bench check. The instance's base commit holds
the bug with the catching tests hidden; `test_patch` brings them back and `patch` is the fix.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kuberl.api.swebench import SWEBenchInstance, test_file_of
from kuberl.swebench import pytest_report
from kuberl.swebench.environments import EnvironmentProblem, EnvironmentRecipe, prepare
from kuberl.swebench.factory import repository, validation
from kuberl.swebench.factory.mutations import Mutation, candidates
from kuberl.swebench.factory.packages import FactoryError, Requirement, fetch_sdist, parse_requirement, unpack
from kuberl.swebench.factory.statements import problem_statement
from kuberl.swebench.factory.testfiles import (
    Definitions,
    defined,
    definitions,
    is_source_file,
    is_test_file,
    test_name,
    without_tests,
)
from kuberl.swebench.factory.testruns import TestRun, run_tests

Progress = Callable[[int, int, str], None]

CREATED_AT = "2025-01-01T00:00:00Z"
ATTEMPTS_PER_INSTANCE = 6
"""Mutations tried per instance wanted, at most."""
MAX_FAIL_TO_PASS = 20
MAX_BROKEN_SHARE = 0.5
"""A bug that breaks more than this share of the tests it is run against is too broad to be a task."""


@dataclass
class PackageReport:
    """What the factory did with one package."""

    requirement: str
    repo: str = ""
    pristine_commit: str = ""
    passing_tests: int = 0
    suite_seconds: float = 0.0
    setup_seconds: float = 0.0
    candidates: int = 0
    tried: int = 0
    kept: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "requirement": self.requirement,
            "repo": self.repo,
            "pristine_commit": self.pristine_commit,
            "passing_tests": self.passing_tests,
            "suite_seconds": round(self.suite_seconds, 2),
            "setup_seconds": round(self.setup_seconds, 1),
            "candidates": self.candidates,
            "tried": self.tried,
            "kept": self.kept,
            "dropped": dict(sorted(self.dropped.items())),
            "seconds": round(self.seconds, 1),
            "error": self.error,
        }


@dataclass
class MakeReport:
    """What a factory run made: per package, and the rate overall."""

    out: Path
    packages: list[PackageReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def instances(self) -> int:
        return sum(p.kept for p in self.packages)

    @property
    def per_minute(self) -> float:
        return self.instances / (self.seconds / 60) if self.seconds > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "instances": self.instances,
            "tried": sum(p.tried for p in self.packages),
            "seconds": round(self.seconds, 1),
            "instances_per_minute": round(self.per_minute, 2),
            "packages": [p.to_json() for p in self.packages],
        }


def make_instances(
    packages: list[str],
    mirror: Path,
    environments: Path,
    out: Path,
    *,
    per_package: int,
    seed: int = 0,
    progress: Progress | None = None,
    workers: int | None = None,
) -> MakeReport:
    """Make up to `per_package` instances of each pinned package into the JSONL file `out`, the repositories
    into `mirror` and their environments into `environments`; a package that fails is reported, not fatal."""
    requirements = [parse_requirement(p) for p in packages]
    notify = progress or (lambda done, total, message: None)
    workers = workers or max(1, min(4, os.cpu_count() or 1))
    total = len(requirements) * per_package
    report = MakeReport(out)
    started = time.monotonic()
    mirror.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="kuberl-factory-"))
    try:
        with out.open("w") as writer:
            for number, requirement in enumerate(requirements):
                base = number * per_package

                def step(kept: int, message: str, base: int = base, name: str = requirement.name) -> None:
                    notify(base + kept, total, f"{name}: {message}")

                def write(instance: SWEBenchInstance) -> None:
                    writer.write(json.dumps(instance.model_dump(mode="json", by_alias=True, exclude_none=True)) + "\n")
                    writer.flush()

                folder = scratch / requirement.name
                folder.mkdir()
                package_report = _make_package(
                    requirement, mirror, environments, folder, per_package, seed, workers, step, write
                )
                shutil.rmtree(folder, ignore_errors=True)
                report.packages.append(package_report)
                notify(base + per_package, total, f"{requirement.name}: {package_report.kept} instances")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


@dataclass(frozen=True)
class _Package:
    """A package ready for mutations: its repository, pristine checkout, environment and passing tests."""

    requirement: Requirement
    repository: Path
    pristine: str
    checkout: Path
    python: Path
    paths: list[str]
    test_files: list[str]
    test_texts: dict[str, str]
    test_definitions: dict[str, Definitions]
    passing: frozenset[str]
    suite_seconds: float

    @property
    def timeout_s(self) -> float:
        return max(15.0, 4 * self.suite_seconds)

    def run(self, folder: Path, files: list[str]) -> TestRun:
        return run_tests(folder, files, self.python, self.paths, self.timeout_s)


@dataclass(frozen=True)
class _Made:
    """A mutation that made an instance (numbered when it is accepted), or why it did not."""

    mutation: Mutation
    instance: SWEBenchInstance | None = None
    dropped: str | None = None


def _make_package(
    requirement: Requirement,
    mirror: Path,
    environments: Path,
    scratch: Path,
    per_package: int,
    seed: int,
    workers: int,
    step: Callable[[int, str], None],
    write: Callable[[SWEBenchInstance], None],
) -> PackageReport:
    report = PackageReport(str(requirement), repo=requirement.repo)
    started = time.monotonic()
    try:
        package = _ready(requirement, mirror, environments, scratch, step)
    except (FactoryError, EnvironmentProblem, RuntimeError, OSError) as error:
        report.error = str(error) if str(requirement) in str(error) else f"{requirement}: {error}"
        report.seconds = time.monotonic() - started
        return report
    report.pristine_commit, report.passing_tests = package.pristine, len(package.passing)
    report.suite_seconds = package.suite_seconds
    report.setup_seconds = time.monotonic() - started
    ordered = _ordered(package, seed)
    report.candidates = len(ordered)
    attempts = iter(enumerate(ordered[: ATTEMPTS_PER_INSTANCE * per_package]))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"factory-{requirement.name}") as pool:
        pending: deque[Future[_Made]] = deque()

        def fill() -> None:
            while len(pending) < workers and (attempt := next(attempts, None)) is not None:
                index, mutation = attempt
                pending.append(pool.submit(_try, package, mutation, scratch / f"try-{index}"))

        fill()
        # Results are taken in the seed's order, so the instances kept do not depend on which run ends first.
        while pending and report.kept < per_package:
            made = pending.popleft().result()
            report.tried += 1
            if made.instance is None:
                report.dropped[made.dropped or "unknown"] += 1
            else:
                instance_id = f"{requirement.mirror_name}-{report.kept + 1}"
                instance = made.instance.model_copy(update={"instance_id": instance_id})
                ref = f"refs/kuberl/{instance_id}"
                repository.set_ref(package.repository, ref, instance.base_commit)
                write(instance)
                report.kept += 1
            step(report.kept, f"tried {report.tried}, kept {report.kept}")
            fill()
        for future in pending:
            future.cancel()
    report.seconds = time.monotonic() - started
    return report


def _ready(
    requirement: Requirement, mirror: Path, environments: Path, scratch: Path, step: Callable[[int, str], None]
) -> _Package:
    """Fetch, commit, prepare and run the package's tests once (twice) on the pristine tree."""
    step(0, "fetching the sdist")
    archive = fetch_sdist(requirement, mirror / ".sdists")
    tree = unpack(archive, scratch / "sdist")
    repo = mirror / requirement.mirror_name
    pristine = repository.pristine_repository(repo, tree, f"{requirement} as published (sdist {archive.name})")
    shutil.rmtree(scratch / "sdist")
    step(0, "preparing the environment")
    environment = prepare(
        EnvironmentRecipe(repo=requirement.repo, commit=pristine), mirror, environments, lambda line: None
    )
    files = repository.files_at(repo, pristine)
    checkout = scratch / "pristine"
    repository.export(repo, pristine, checkout)
    paths = pytest_report.source_paths(files)
    test_files = [f for f in files if is_test_file(f)]
    if not test_files:
        raise FactoryError(f"{requirement}: its sdist ships no test files (test_*.py); pick another package")
    step(0, "running its tests on the pristine tree")
    timeout_s = 600.0
    first = run_tests(checkout, test_files, environment.python, paths, timeout_s)
    # A test file that cannot even be collected (a missing optional dependency) stops pytest: run without it.
    broken = {test_file_of(node) for node, outcome in first.outcomes.items() if outcome == "error" and "::" not in node}
    if broken - {None}:
        test_files = [f for f in test_files if f not in broken]
        first = run_tests(checkout, test_files, environment.python, paths, timeout_s)
    second = run_tests(checkout, test_files, environment.python, paths, timeout_s)
    passing = first.passing() & second.passing()
    passing = {node for node in passing if test_name(node) is not None}
    if not passing:
        tail = " | ".join(first.output.strip().splitlines()[-2:])
        raise FactoryError(f"{requirement}: no test passes on the pristine tree ({tail}); pick another package")
    used = sorted({test_file_of(node) for node in passing} - {None})  # type: ignore[type-var]
    texts = {f: (checkout / f).read_text(errors="replace") for f in used}
    return _Package(
        requirement=requirement,
        repository=repo,
        pristine=pristine,
        checkout=checkout,
        python=environment.python,
        paths=paths,
        test_files=used,
        test_texts=texts,
        test_definitions={f: definitions(text) for f, text in texts.items()},
        passing=frozenset(passing),
        suite_seconds=min(first.seconds, second.seconds),
    )


def _ordered(package: _Package, seed: int) -> list[Mutation]:
    """Every mutation of the package's source, in the seed's order: code its tests name first, one mutation
    per function before a second one in any, and the kinds interleaved."""
    found: list[Mutation] = []
    for path in sorted(package.checkout.rglob("*.py")):
        relative = path.relative_to(package.checkout).as_posix()
        if is_source_file(relative):
            found += candidates(path.read_text(errors="replace"), relative)
    random.Random(f"{seed}:{package.requirement}").shuffle(found)
    tests = "\n".join(package.test_texts.values())
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", tests))
    per_function: Counter[tuple[str, str]] = Counter()
    per_kind: Counter[str] = Counter()
    keys = []
    for index, mutation in enumerate(found):
        names = mutation.function.split(".")
        named = any(n in words for n in names if not n.startswith("__")) or names[-1] in words
        keys.append((not named, per_function[(mutation.file, mutation.function)], per_kind[mutation.kind], index))
        per_function[(mutation.file, mutation.function)] += 1
        per_kind[mutation.kind] += 1
    return [found[key[-1]] for key in sorted(keys)]


def _relevant_tests(package: _Package, mutation: Mutation) -> list[str]:
    """The test files to run against a mutation: those that name its function, class or module (all when none
    does). Chosen from the files' text, not from how long the suite took, so that a run does not depend on load."""
    module = Path(mutation.file).stem
    names = [n for n in [*mutation.function.split("."), module] if not n.startswith("__")]
    pattern = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b") if names else None
    files = [f for f in package.test_files if pattern and pattern.search(package.test_texts[f])]
    return files or package.test_files


def _try(package: _Package, mutation: Mutation, folder: Path) -> _Made:
    """Apply one mutation, run the tests, and make and check the instance it gives (if any)."""
    try:
        return _made(package, mutation, folder)
    except (RuntimeError, OSError, ValueError) as error:  # one odd mutation must not stop the package
        return _Made(mutation, dropped=f"error: {type(error).__name__}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _made(package: _Package, mutation: Mutation, folder: Path) -> _Made:
    try:
        buggy = mutation.apply()
    except ValueError:
        return _Made(mutation, dropped="not valid Python")
    trial = folder / "trial"
    shutil.copytree(package.checkout, trial, symlinks=True)
    (trial / mutation.file).write_text(buggy)
    files = _relevant_tests(package, mutation)
    run = package.run(trial, files)
    if run.timed_out:
        return _Made(mutation, dropped="timed out")
    if not run.outcomes:
        return _Made(mutation, dropped="no test report")
    expected = sorted(n for n in package.passing if test_file_of(n) in files)
    failing = [n for n in expected if not pytest_report.passed(run.outcomes, n)]
    if not failing:
        return _Made(mutation, dropped="not caught")
    if len(failing) > MAX_BROKEN_SHARE * len(expected):
        return _Made(mutation, dropped="too broad")
    hideable = [n for n in failing if (name := test_name(n)) and defined(name, package.test_definitions[name.file])]
    fail_to_pass = hideable[:MAX_FAIL_TO_PASS]
    if not fail_to_pass:
        return _Made(mutation, dropped="no hideable test")
    hidden_files = sorted({test_file_of(n) for n in fail_to_pass})  # type: ignore[type-var]
    broken = set(failing)
    pass_to_pass = [n for n in expected if test_file_of(n) in hidden_files and n not in broken]
    changes: dict[str, str | None] = {mutation.file: buggy}
    for file in hidden_files:
        names = [name for n in fail_to_pass if test_file_of(n) == file and (name := test_name(n))]
        changes[file] = without_tests(package.test_texts[file], names)
    repo, pristine = package.repository, package.pristine
    base = repository.commit_changes(repo, pristine, changes, "Hide the tests that catch a procedural bug")
    requirement = package.requirement
    instance = SWEBenchInstance(
        instance_id=f"{requirement.mirror_name}-0",
        repo=requirement.repo,
        base_commit=base,
        patch=repository.diff(repo, base, pristine, [mutation.file]),
        test_patch=repository.diff(repo, base, pristine, hidden_files),
        problem_statement=problem_statement(
            requirement.name, requirement.version, fail_to_pass, run.output, str(trial)
        ),
        hints_text="",
        created_at=CREATED_AT,
        version=requirement.version,
        environment_setup_commit=pristine,
        FAIL_TO_PASS=fail_to_pass,
        PASS_TO_PASS=pass_to_pass,
        kuberl_bug={"kind": mutation.kind, "file": mutation.file, "line": mutation.line},
    )
    if (problem := validation.check(repo, instance, folder / "check", package.run)) is not None:
        return _Made(mutation, dropped=f"check failed: {problem.split(':')[0]}")
    return _Made(mutation, instance=instance)
