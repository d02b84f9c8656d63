"""Task suites: the built-in generators and user JSONL files, loaded as `Task` lists (see docs/tasks.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from urllib.parse import unquote, urlparse

from kuberl.api.environment import Task
from kuberl.api.spec import TaskSplit
from kuberl_sandbox.suites import swe_toy
from kuberl_sandbox.suites.store import read_jsonl

BUILTIN_SUITES: dict[str, Callable[..., list[Task]]] = {
    swe_toy.SUITE: swe_toy.generate,
}


def load_tasks(name: str, uri: str | None = None, split: str | None = None) -> list[Task]:
    """The tasks of JSONL file `uri`, or of built-in suite `name` when `uri` is None; only `split` if given."""
    wanted = _parse_split(split)
    if uri is not None:
        tasks = read_jsonl(_local_path(uri))
    elif name in BUILTIN_SUITES:
        tasks = BUILTIN_SUITES[name]()
    else:
        known = ", ".join(sorted(BUILTIN_SUITES))
        raise ValueError(
            f"unknown built-in task suite {name!r}; known suites: {known} (or set tasks.uri to a JSONL file)"
        )
    return tasks if wanted is None else [task for task in tasks if task.split == wanted]


def _parse_split(split: str | None) -> TaskSplit | None:
    if split is None:
        return None
    try:
        return TaskSplit(split)
    except ValueError:
        raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(TaskSplit)}") from None


def _local_path(uri: str) -> Path:
    """A local path or file:// URI as a path; remote stores (s3://...) are fetched by the caller first."""
    if uri.startswith("file://"):
        return Path(unquote(urlparse(uri).path))
    if "://" in uri:
        raise ValueError(f"task file {uri!r}: only local paths and file:// URIs can be read here; download it first")
    return Path(uri)
