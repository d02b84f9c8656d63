"""Reading Dockerfiles in tests (no Docker engine here to build them)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path


def instructions(path: Path) -> Iterator[tuple[str, str]]:
    """(KEYWORD, rest) of every instruction, continuation lines joined, comments left out."""
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            yield keyword.upper(), rest.strip()
