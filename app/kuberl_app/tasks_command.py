"""`kuberl tasks`: SWE-bench-format instances on real repositories: make, prepare and check them."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import click

EXIT_INVALID = 2
DEFAULT_ENVIRONMENTS = "runs/environments"


def _read(file: str) -> list:
    from kuberl.swebench.instances import read_instances

    try:
        instances, problems = read_instances(file)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    for problem in problems:
        click.echo(str(problem), err=True)
    if problems:
        click.echo(f"{len(problems)} problem(s) in {file}; fix or remove those rows", err=True)
        sys.exit(EXIT_INVALID)
    if not instances:
        raise click.UsageError(f"{file}: no instances")
    return instances


def prepare_environments(instances: list, repos: Path, environments: Path) -> list[str]:
    """Build every distinct environment the instances need, with a progress bar; the failures, one line each."""
    from kuberl.swebench.environments import EnvironmentProblem, find, prepare, recipe_for
    from kuberl.swebench.mirror import MirrorError

    recipes: dict[str, tuple] = {}
    for instance in instances:
        recipe = recipe_for(instance)
        recipes.setdefault(recipe.key, (recipe, []))[1].append(instance.instance_id)
    missing = {key: value for key, value in recipes.items() if find(environments, key) is None}
    click.echo(f"{len(recipes)} environment(s) for {len(instances)} instance(s); {len(missing)} to build")
    failures: list[str] = []
    if not missing:
        return failures
    with click.progressbar(
        list(missing.values()),
        label="preparing environments",
        item_show_func=lambda item: item[0].repo if item else None,
        file=sys.stderr,
    ) as bar:
        for recipe, ids in bar:
            try:
                prepare(recipe, repos, environments)
            except (EnvironmentProblem, MirrorError) as err:
                more = f" and {len(ids) - 1} more" if len(ids) > 1 else ""
                failures.append(f"environment {recipe.key} of {recipe.repo} ({ids[0]}{more}): {err}")
    return failures


def _repos_option(function):
    return click.option(
        "--repos", required=True, type=click.Path(file_okay=False, exists=True), help="The mirror of repositories."
    )(function)


def _environments_option(function):
    return click.option(
        "--environments",
        default=DEFAULT_ENVIRONMENTS,
        show_default=True,
        type=click.Path(file_okay=False),
        help="Where prepared environments are kept.",
    )(function)


@click.group("tasks")
def tasks() -> None:
    """SWE-bench-format instances on real repositories (docs/tasks.md)."""


@tasks.command("prepare")
@click.argument("file", metavar="INSTANCES.jsonl", type=click.Path(dir_okay=False, exists=True))
@_repos_option
@_environments_option
def prepare_command(file: str, repos: str, environments: str) -> None:
    """Build every environment the instances need (a virtualenv per repository, environment commit and install
    recipe), once; exits 1 naming each one that cannot be built."""
    failures = prepare_environments(_read(file), Path(repos), Path(environments))
    for line in failures:
        click.echo(line, err=True)
    if failures:
        sys.exit(1)
    click.echo(f"environments ready in {environments}")


@tasks.command("check")
@click.argument("file", metavar="INSTANCES.jsonl", type=click.Path(dir_okay=False, exists=True))
@_repos_option
@_environments_option
@click.option(
    "--concurrency", default=2, show_default=True, type=click.IntRange(1, 64), help="Instances checked at once."
)
def check_command(file: str, repos: str, environments: str, concurrency: int) -> None:
    """Gold validation in the sandbox: with `patch` each instance must be resolved; unchanged, its FAIL_TO_PASS
    tests fail and its PASS_TO_PASS tests pass. One line per instance, then `N/M instances valid`; exit 0
    only when all are."""
    from kuberl_app.one_machine.task_check import check_instances

    instances = _read(file)
    for line in prepare_environments(instances, Path(repos), Path(environments)):
        click.echo(line, err=True)
    verdicts = asyncio.run(
        check_instances(instances, Path(repos), Path(environments), concurrency, lambda v: click.echo(v.line()))
    )
    valid = sum(v.valid for v in verdicts)
    click.echo(f"{valid}/{len(verdicts)} instances valid")
    if valid != len(verdicts):
        sys.exit(1)


@tasks.command("make")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The instance file to write.")
@click.option("--repos", required=True, type=click.Path(file_okay=False), help="The mirror to add repositories to.")
@_environments_option
@click.option("--package", "packages", multiple=True, help="A pinned package, name==version (repeat) [the defaults].")
@click.option(
    "--per-package", default=24, show_default=True, type=click.IntRange(1, 1000), help="Instances made per package."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the bugs' draw.")
def make_command(
    out: str, repos: str, environments: str, packages: tuple[str, ...], per_package: int, seed: int
) -> None:
    """Build SWE-bench-format instances from real Python packages: procedural bugs that their own tests catch,
    the catching tests hidden in `test_patch`, the fix in `patch`."""
    from kuberl.swebench.factory import DEFAULT_PACKAGES, FactoryError, make_instances

    started = time.monotonic()
    try:
        with click.progressbar(length=1, label="making instances", file=sys.stderr) as bar:

            def progress(done: int, total: int, message: str) -> None:
                bar.length = max(total, 1)
                bar.update(done - bar.pos, message)

            report = make_instances(
                list(packages or DEFAULT_PACKAGES),
                Path(repos),
                Path(environments),
                Path(out),
                per_package=per_package,
                seed=seed,
                progress=progress,
            )
    except FactoryError as err:
        raise click.UsageError(str(err)) from None
    click.echo(json.dumps(report.to_json(), indent=2))
    failed = [p for p in report.packages if p.error]
    for package in failed:
        click.echo(str(package.error), err=True)  # it names the package
    click.echo(f"wrote {report.instances} instance(s) to {out} in {time.monotonic() - started:.0f} s")
    if failed or not report.instances:
        sys.exit(1)
