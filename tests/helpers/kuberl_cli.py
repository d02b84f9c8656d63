"""`kuberl` commands as the tests run them: the console script in its own process, as a user runs it, or the
same command in the test's process for the many checks of what one command answers (a tenth of the CPU: the
process start and its imports are most of a `kuberl validate`)."""

from __future__ import annotations

import os
import subprocess

from click.testing import CliRunner
from conftest import BIN

KUBERL = str(BIN / "kuberl")


def kuberl(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`kuberl ARGS` in its own process, with `env` added to this process's environment."""
    return subprocess.run(
        [KUBERL, *args], capture_output=True, text=True, input=stdin, timeout=timeout, env={**os.environ, **(env or {})}
    )


def kuberl_here(
    *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`kuberl ARGS` run in this process, answered as `kuberl` would: its exit status, stdout and stderr. An
    exception the command did not turn into an exit is raised here, where a process would have printed it."""
    from kuberl_app.cli import main

    result = CliRunner().invoke(main, list(args), input=stdin, env=env, prog_name="kuberl")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(["kuberl", *args], result.exit_code, result.stdout, result.stderr)
