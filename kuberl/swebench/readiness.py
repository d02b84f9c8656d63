"""What a job on SWE-bench-format instances needs before it starts: the mirror, every base commit, every
prepared environment; and the environment variables that point its sandbox servers at them."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from kuberl.api import env_vars
from kuberl.api.spec import SWE_BENCH, EnvironmentSpec
from kuberl.swebench.environments import find, python_for, recipe_for
from kuberl.swebench.instances import load_instances
from kuberl.swebench.mirror import MirrorError, repository_path, resolve_commit

DEFAULT_ENVIRONMENTS = Path("runs/environments")
MIRROR_CACHE = Path(".cache/mirrors")
"""Where an `s3://` mirror is copied to on this machine."""


def environments_folder(env: EnvironmentSpec) -> Path:
    return Path(env.tasks.environments).absolute() if env.tasks.environments else DEFAULT_ENVIRONMENTS.absolute()


def mirror_folder(env: EnvironmentSpec) -> Path:
    """The mirror as a local folder (an `s3://` prefix is copied first, unchanged objects not again)."""
    assert env.tasks.repos is not None
    if env.tasks.repos.startswith("s3://"):
        return download_mirror(env.tasks.repos, MIRROR_CACHE.absolute())
    return Path(env.tasks.repos.removeprefix("file://")).absolute()


def sandbox_environment(env: EnvironmentSpec) -> dict[str, str]:
    """The sandbox servers' variables for the job's mirror and environments (none for other environments)."""
    if env.name != SWE_BENCH or env.tasks.repos is None:
        return {}
    return {
        env_vars.SANDBOX_REPOS: str(mirror_folder(env)),
        env_vars.SANDBOX_ENVIRONMENTS: str(environments_folder(env)),
    }


def readiness_problems(env: EnvironmentSpec) -> list[str]:
    """One line per thing missing before a job on these instances can start (empty: ready)."""
    if env.name != SWE_BENCH or env.tasks.uri is None:
        return []
    if env.tasks.repos is None:
        return [
            "spec.environment.tasks.repos: on one machine instances run from the mirror of their repositories, "
            "not from their images (those are for a cluster): give the mirror (docs/swe-bench.md, section 2)"
        ]
    if env.tasks.uri.startswith("s3://"):
        return []  # read by the servers themselves; the row checks run there
    mirror, environments = mirror_folder(env), environments_folder(env)
    if not mirror.is_dir():
        return [f"spec.environment.tasks.repos: {mirror} is not a folder"]
    problems: list[str] = []
    checked: set[tuple[str, str]] = set()
    for instance in load_instances(env.tasks.uri.removeprefix("file://")):
        recipe = recipe_for(instance)
        try:
            repository = repository_path(mirror, instance.repo)
            if (instance.repo, instance.base_commit) not in checked:
                resolve_commit(repository, instance.base_commit)
                checked.add((instance.repo, instance.base_commit))
            python_for(recipe.python)
        except (MirrorError, RuntimeError) as err:
            problems.append(f"instance {instance.instance_id}: {err}")
            continue
        if find(environments, recipe.key) is None:
            problems.append(
                f"instance {instance.instance_id}: environment {recipe.key} is not prepared in {environments} "
                f"(run `kuberl tasks prepare {env.tasks.uri} --repos {env.tasks.repos} --environments {environments}`)"
            )
    return problems


def download_mirror(uri: str, cache: Path) -> Path:
    """Copy every object under an `s3://bucket/prefix` into `cache/bucket/prefix` (credentials and
    AWS_ENDPOINT_URL from the environment); objects already there with the same size are kept."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    parsed = urlparse(uri)
    bucket, prefix = parsed.netloc, parsed.path.strip("/")
    target = cache / bucket / prefix
    client = boto3.client("s3")
    try:
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for item in page.get("Contents", []):
                relative = item["Key"][len(prefix) :].lstrip("/")
                local = target / relative
                if not relative or ".." in relative.split("/"):
                    continue
                if local.is_file() and local.stat().st_size == item["Size"]:
                    continue
                local.parent.mkdir(parents=True, exist_ok=True)
                client.download_file(bucket, item["Key"], str(local))
    except (BotoCoreError, ClientError) as err:
        raise MirrorError(f"spec.environment.tasks.repos {uri}: cannot download the mirror ({err})") from None
    # object stores keep no empty folders, and git does not take a folder without refs/ for a repository
    for head in [*target.glob("*/HEAD"), *target.glob("*/.git/HEAD")]:
        (head.parent / "refs" / "heads").mkdir(parents=True, exist_ok=True)
        (head.parent / "objects").mkdir(exist_ok=True)
    return target
