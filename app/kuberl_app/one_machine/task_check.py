"""Gold validation of SWE-bench-format instances in the real sandbox, as every such dataset is checked.

Each instance runs twice in sandbox sessions: with the gold `patch` applied the submission must be resolved;
unchanged, every FAIL_TO_PASS test must fail and every PASS_TO_PASS test pass (both with `test_patch`
applied at scoring, as for an agent). The sessions are this process's own sandbox: the same workspace,
environment, isolation and scoring an episode gets.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kuberl.api.swebench import SWEBenchInstance
from kuberl.swebench.instances import instance_task
from kuberl_sandbox.metrics import SandboxMetrics
from kuberl_sandbox.session_manager import SessionError, SessionManager
from kuberl_sandbox.settings import CommandLimits, SandboxSettings
from kuberl_sandbox.testrun import TestOutcome

TEST_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Verdict:
    instance_id: str
    reason: str | None
    """None: valid."""

    @property
    def valid(self) -> bool:
        return self.reason is None

    def line(self) -> str:
        return f"VALID {self.instance_id}" if self.valid else f"INVALID {self.instance_id}: {self.reason}"


def _last_line(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


def _counts(outcome: TestOutcome) -> tuple[tuple[int, int], tuple[int, int]]:
    resolution = outcome.resolution
    assert resolution is not None
    f2p, p2p = resolution.fail_to_pass, resolution.pass_to_pass
    return (f2p.passed, f2p.total), (p2p.passed, p2p.total)


async def _check_one(manager: SessionManager, instance: SWEBenchInstance) -> Verdict:
    task = instance_task(instance)
    name = instance.instance_id
    if not instance.patch.strip():
        return Verdict(name, "no gold patch (field `patch` is empty)")
    try:
        gold = await manager.create(task)
    except SessionError as err:
        return Verdict(name, str(err))
    try:
        applied = await manager.apply_patch(gold, instance.patch)
        if applied.exit_code != 0:
            return Verdict(name, f"the gold patch does not apply: {_last_line(applied.output)}")
        outcome = await manager.run_tests(gold, hidden=True)
    finally:
        await manager.close(gold.session_id)
    (f_pass, f_total), (p_pass, p_total) = _counts(outcome)
    if outcome.tampering is not None or not (f_pass == f_total and p_pass == p_total):
        why = f", report not trusted ({outcome.tampering.value})" if outcome.tampering is not None else ""
        return Verdict(
            name,
            f"the gold patch does not resolve it: FAIL_TO_PASS {f_pass}/{f_total} pass, "
            f"PASS_TO_PASS {p_pass}/{p_total} pass{why}; {_last_line(outcome.output)}",
        )
    before = await manager.create(task)
    try:
        outcome = await manager.run_tests(before, hidden=True)
    finally:
        await manager.close(before.session_id)
    (f_pass, f_total), (p_pass, p_total) = _counts(outcome)
    if f_pass:
        return Verdict(name, f"unchanged, {f_pass} of {f_total} FAIL_TO_PASS tests already pass")
    if p_pass != p_total:
        return Verdict(name, f"unchanged, only {p_pass} of {p_total} PASS_TO_PASS tests pass")
    return Verdict(name, None)


def sandbox_settings(root: Path, repos: Path, environments: Path) -> SandboxSettings:
    """A sandbox of this process for checks: isolated when run as root, shared-user otherwise."""
    limits = CommandLimits(timeout_s=TEST_TIMEOUT_S, memory_bytes=4 << 30)
    return SandboxSettings(
        root=root,
        token=secrets.token_hex(16),
        limits=limits,
        max_timeout_s=TEST_TIMEOUT_S,
        repos=repos,
        environments=environments,
        allow_shared_user=os.geteuid() != 0,
        test_outcomes_kept=0,
    )


async def check_instances(
    instances: list[SWEBenchInstance],
    repos: Path,
    environments: Path,
    concurrency: int = 2,
    on_verdict: Callable[[Verdict], None] = lambda verdict: None,
) -> list[Verdict]:
    """The verdict on every instance (in input order); `on_verdict` hears each as it comes."""
    with tempfile.TemporaryDirectory(prefix="kuberl-check-") as folder:
        os.chmod(folder, 0o711)
        manager = SessionManager(sandbox_settings(Path(folder) / "sandbox", repos, environments), SandboxMetrics())
        manager.prepare()
        slots = asyncio.Semaphore(concurrency)

        async def one(instance: SWEBenchInstance) -> Verdict:
            async with slots:
                verdict = await _check_one(manager, instance)
            on_verdict(verdict)
            return verdict

        try:
            return list(await asyncio.gather(*(one(i) for i in instances)))
        finally:
            await manager.close_all()
