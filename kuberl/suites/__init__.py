"""Task suites: the built-in generators and user JSONL files, loaded as `Task` lists (see docs/tasks.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kuberl.api.environment import Task
from kuberl.api.spec import SWE_BENCH, EnvironmentSpec, TaskSplit, openenv_class
from kuberl.storage import local_file
from kuberl.suites import seeds, swe_toy
from kuberl.suites.store import read_jsonl

BUILTIN_SUITES: dict[str, Callable[..., list[Task]]] = {
    swe_toy.SUITE: swe_toy.generate,
}
BUILTIN_ENVIRONMENTS = (SWE_BENCH, *BUILTIN_SUITES)
"""spec.environment.name's built-in values (beside `openenv:module:Class`)."""


def load_tasks(name: str, uri: str | None = None, split: str | None = None, count: int | None = None) -> list[Task]:
    """The tasks of JSONL file `uri`, or of built-in suite `name` when `uri` is None (its first `count` tasks,
    or its default number); only `split` if given."""
    wanted = _parse_split(split)
    if name == SWE_BENCH:
        tasks = _read_instances(uri)
    elif uri is not None and uri.startswith("s3://"):
        tasks = _read_s3(uri)
    elif uri is not None:
        tasks = read_jsonl(_local_path(uri))
    elif name in BUILTIN_SUITES or openenv_class(name) is not None:
        generate = BUILTIN_SUITES.get(name, seeds.generate)  # an OpenEnv environment's tasks are reset seeds
        tasks = generate() if count is None else generate(count=count)
    else:
        known = ", ".join(sorted(BUILTIN_SUITES))
        raise ValueError(
            f"unknown built-in task suite {name!r}; known suites: {known}, or openenv:module:Class for an OpenEnv "
            "environment's reset seeds (or set tasks.uri to a JSONL file)"
        )
    return tasks if wanted is None else [task for task in tasks if task.split == wanted]


def environment_tasks(env: EnvironmentSpec, split: str | None = None) -> list[Task]:
    """The tasks an RLJob's `spec.environment` names (its file, or its built-in suite at `tasks.count`)."""
    return load_tasks(env.name, env.tasks.uri, split, env.tasks.count)


def _parse_split(split: str | None) -> TaskSplit | None:
    if split is None:
        return None
    try:
        return TaskSplit(split)
    except ValueError:
        raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(TaskSplit)}") from None


def _local_path(uri: str) -> Path:
    """A local path or file:// URI as a path."""
    with local_file(uri, "task file") as path:
        return path


def _read_instances(uri: str | None) -> list[Task]:
    """SWE-bench-format rows (a local file or s3://) as Tasks on their repositories."""
    from kuberl.swebench.instances import read_tasks

    if uri is None:
        raise ValueError(f"environment {SWE_BENCH} reads its instances from tasks.uri (a SWE-bench-format JSONL file)")
    return _read_s3(uri, read_tasks) if uri.startswith("s3://") else read_tasks(_local_path(uri))


def _read_s3(uri: str, read: Callable[[Path], list[Task]] = read_jsonl) -> list[Task]:
    """Download an s3:// task file (credentials and AWS_ENDPOINT_URL from the environment) and read it."""
    with local_file(uri, "task file") as path:
        return read(path)
