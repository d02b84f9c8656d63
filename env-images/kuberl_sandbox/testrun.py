"""What a test run found: how many tests passed, and for a submission the SWE-bench verdict."""

from __future__ import annotations

import json
import re
import secrets
import shlex
from dataclasses import dataclass

from kuberl.api.tampering import TamperingReason
from kuberl_sandbox.execution import CommandResult

_TEST_DEF = re.compile(r"^\s+def (test\w*)\s*\(", re.MULTILINE)


@dataclass(frozen=True)
class Resolution:
    """SWE-bench's verdict on a submission: its FAIL_TO_PASS tests now pass and its PASS_TO_PASS tests still do."""

    fail_to_pass: TestOutcome
    pass_to_pass: TestOutcome

    @property
    def resolved(self) -> bool:
        return all(outcome.passed == outcome.total for outcome in (self.fail_to_pass, self.pass_to_pass))

    def combined(self) -> TestOutcome:
        """Both runs as one outcome (counts summed, outputs joined) carrying this verdict."""
        runs = (self.fail_to_pass, self.pass_to_pass)
        failed = [o.exit_code for o in runs if o.exit_code != 0]
        tampered = [o.tampering for o in runs if o.tampering is not None]
        return TestOutcome(
            total=sum(o.total for o in runs),
            passed=sum(o.passed for o in runs),
            output="\n".join(o.output for o in runs if o.output),
            exit_code=failed[0] if failed else 0,
            timed_out=any(o.timed_out for o in runs),
            resolution=self,
            tampering=tampered[0] if tampered else None,
        )

    def as_info(self) -> dict[str, object]:
        counts = {"failToPass": self.fail_to_pass, "passToPass": self.pass_to_pass}
        return {key: {"total": o.total, "passed": o.passed} for key, o in counts.items()} | {"resolved": self.resolved}


@dataclass(frozen=True)
class TestOutcome:
    total: int
    passed: int
    output: str
    exit_code: int | None
    timed_out: bool
    resolution: Resolution | None = None
    """Set for a hidden run of a task with failToPass."""
    tampering: TamperingReason | None = None
    """Why the run's report was not trusted (it then counts no test as passed)."""

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def as_info(self) -> dict[str, object]:
        info = {
            "total": self.total,
            "passed": self.passed,
            "fraction": self.fraction,
            "exitCode": self.exit_code,
            "timedOut": self.timed_out,
        }
        info |= {"tampering": self.tampering.value} if self.tampering is not None else {}
        return info | (self.resolution.as_info() if self.resolution else {})


def count_test_methods(sources: list[str]) -> int:
    """Test methods defined in unittest files: the denominator when a crash hides how many there were."""
    return sum(len(_TEST_DEF.findall(src)) for src in sources)


# ------------------------------------------------------------------ a report from the agent's process
def new_nonce() -> str:
    """Marks the report line of one run (the agent's code does not know it in advance)."""
    return f"KUBERL-REPORT-{secrets.token_hex(16)}:"


def isolated_python(script: str, request: object) -> str:
    """The shell command that runs `script` under `python -I -B` (no user site, no PYTHON* variables, no
    bytecode written) with `request`, as JSON, for its one argument."""
    return f"python -I -B -c {shlex.quote(script)} {shlex.quote(json.dumps(request))}"


@dataclass(frozen=True)
class RawReport:
    """What a run printed, split: the one report after the nonce (if there was exactly one), the rest."""

    payload: str | None
    tampering: TamperingReason | None
    """NO_REPORT or SEVERAL_REPORTS (None when the run timed out without one: that is not tampering)."""
    output: str


def split_report(result: CommandResult, nonce: str) -> RawReport:
    lines = result.output.split("\n")
    reports = [line[len(nonce) :] for line in lines if line.startswith(nonce)]
    output = "\n".join(line for line in lines if not line.startswith(nonce)).strip()
    if len(reports) > 1:
        return RawReport(None, TamperingReason.SEVERAL_REPORTS, output)
    if not reports:
        return RawReport(None, None if result.timed_out else TamperingReason.NO_REPORT, output)
    return RawReport(reports[0], None, output)
