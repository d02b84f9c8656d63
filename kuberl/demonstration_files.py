"""Demonstrations files (JSONL, one kuberl.api.demonstrations.Demonstration per line): read, or checked line by
line for `kuberl validate`."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from kuberl.api.demonstrations import Demonstration
from kuberl.storage import local_file

FIELD = "spec.training.warmup.demonstrations"


def read_demonstrations(uri: str) -> list[Demonstration]:
    """Every demonstration of the JSONL file `uri` (a local path, file:// or s3://); a bad line raises
    ValueError naming the file, the line and the field."""
    demos, problems = _read(uri)
    if problems:
        raise ValueError(problems[0])
    if not demos:
        raise ValueError(f"{FIELD}: {uri} holds no demonstrations")
    return demos


def demonstration_file_problems(uri: str) -> list[str]:
    """Every bad line of the file, one message each naming the line and the field (empty: all good)."""
    return _read(uri)[1]


def _read(uri: str) -> tuple[list[Demonstration], list[str]]:
    with local_file(uri, f"{FIELD} file") as path:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as error:
            return [], [f"{FIELD} file {uri} cannot be read ({error}): name a JSONL file of demonstrations that exists"]
    demos, problems = [], []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            demos.append(_parse_line(uri, number, line))
        except ValueError as error:
            problems.append(str(error))
    return demos, problems


def _parse_line(uri: str, number: int, line: str) -> Demonstration:
    where = f"{uri} line {number}"
    try:
        return Demonstration.model_validate(json.loads(line))
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not valid JSON: {error}") from None
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or '(demonstration)'}: {item['msg']}" for item in error.errors()
        )
        raise ValueError(f"{where}: {problems} (the format: docs/warmup.md)") from None
