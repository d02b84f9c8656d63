"""Run a task's tests and read unittest's summary: how many ran, how many passed."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kuberl_sandbox.execution import CommandResult

_RAN = re.compile(r"^Ran (\d+) tests? in", re.MULTILINE)
_FAILED = re.compile(r"^FAILED \(([^)]*)\)", re.MULTILINE)
_COUNT = re.compile(r"(failures|errors|unexpected successes)=(\d+)")
_TIMING = re.compile(r"^(Ran \d+ tests?) in \d+(\.\d+)?s$", re.MULTILINE)
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
        return TestOutcome(total=sum(o.total for o in runs), passed=sum(o.passed for o in runs),
                           output="\n".join(o.output for o in runs if o.output),
                           exit_code=failed[0] if failed else 0, timed_out=any(o.timed_out for o in runs),
                           resolution=self)  # fmt: skip

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

    @property
    def fraction(self) -> float:
        return self.passed / self.total if self.total else 0.0

    def as_info(self) -> dict[str, object]:
        info = {"total": self.total, "passed": self.passed, "fraction": self.fraction, "exitCode": self.exit_code,
                "timedOut": self.timed_out}  # fmt: skip
        return info | (self.resolution.as_info() if self.resolution else {})


def count_test_methods(sources: list[str]) -> int:
    """Test methods defined in unittest files: the denominator when a crash hides how many there were."""
    return sum(len(_TEST_DEF.findall(src)) for src in sources)


def summarize(result: CommandResult, expected_total: int = 0) -> TestOutcome:
    """Pass counts from unittest output; a run that crashed before reporting counts as all failed."""
    ran = _RAN.findall(result.output)
    total = int(ran[-1]) if ran else 0
    failed = 0
    if failures := _FAILED.findall(result.output):
        failed = sum(int(n) for _, n in _COUNT.findall(failures[-1]))
    passed = max(0, total - failed) if ran and result.exit_code is not None else 0
    return TestOutcome(
        total=max(total, expected_total),
        passed=passed,
        # Timings vary run to run; without them the same workspace gives the same observation.
        output=_TIMING.sub(r"\1", result.output),
        exit_code=result.exit_code,
        timed_out=result.timed_out,
    )
