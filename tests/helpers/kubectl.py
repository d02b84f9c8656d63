"""The real `kubectl` (client 1.32 on this machine) as a user runs it, against the emulated API server
(tests/helpers/emulator.py) or any other: a kubeconfig and a discovery cache of its own in a folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from helpers.emulator import write_kubeconfig

KUBECTL = shutil.which("kubectl")


class Kubectl:
    """`kubectl` with a kubeconfig for `url` written to `folder` (and its cache there, not in ~/.kube)."""

    def __init__(self, url: str, folder: Path, namespace: str = "default") -> None:
        if KUBECTL is None:
            raise RuntimeError("kubectl is not on PATH")
        folder.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = write_kubeconfig(folder / "kubeconfig", url, namespace)
        self.cache = folder / "kubectl-cache"

    def run(self, *args: str, stdin: str | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run `kubectl ARGS`, whatever its exit status."""
        command = [str(KUBECTL), "--kubeconfig", str(self.kubeconfig), "--cache-dir", str(self.cache), *args]
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        return subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=timeout, env=env)

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        """The standard output of `kubectl ARGS`; an AssertionError with its standard error if it fails."""
        result = self.run(*args, stdin=stdin)
        if result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self(*args, "-o", "json"))


def table_rows(output: str) -> list[dict[str, str]]:
    """kubectl's table output as one {column: cell} per row; a blank cell is ''. Several tables (one per
    kind, as `kubectl get a,b` prints them) are read one after the other."""
    rows: list[dict[str, str]] = []
    for block in output.strip().split("\n\n"):
        header, *lines = block.splitlines()
        names, starts, position = header.split(), [], 0
        for name in names:
            position = header.index(name, position)
            starts.append(position)
            position += len(name)
        bounds = [*starts[1:], None]
        rows += [{n: line[s:e].strip() for n, s, e in zip(names, starts, bounds, strict=True)} for line in lines]
    return rows
