"""Why the sandbox judged a test report forged or broken (tampering is visible).

The report comes back from the process that runs the agent's code, so that code can touch it. The sandbox
checks it against the test ids it expects; when the report does not hold up, the submission (or test run)
scores 0 and the sandbox names one of these reasons: in the tool result's info (`hiddenTests.tampering` for
`submit`, `tests.tampering` for `run_tests`), in `kuberl_sandbox_tampering_total{reason}`, and on the
trajectory (`Trajectory.tampering`). Defined here, in the API every tier may import, so the sandbox, the
rollout tier and the docs share one set.
"""

from __future__ import annotations

from enum import StrEnum


class TamperingReason(StrEnum):
    """Why a test report was judged forged or broken; the submission or test run scored 0 for it."""

    NO_REPORT = "no_report"
    SEVERAL_REPORTS = "several_reports"
    MALFORMED_REPORT = "malformed_report"
    MISSING_ANSWERS = "missing_answers"
    EXTRA_ANSWERS = "extra_answers"
    DUPLICATE_ANSWERS = "duplicate_answers"

    @property
    def description(self) -> str:
        """One line saying what the sandbox saw (docs/metrics.md, docs/sandbox.md)."""
        return DESCRIPTIONS[self]


DESCRIPTIONS: dict[TamperingReason, str] = {
    TamperingReason.NO_REPORT: "the process that ran the agent's code returned no report at all",
    TamperingReason.SEVERAL_REPORTS: "more than one report came back where one was expected",
    TamperingReason.MALFORMED_REPORT: "the report could not be read (not the expected format or types)",
    TamperingReason.MISSING_ANSWERS: "the report leaves out test ids the sandbox expected",
    TamperingReason.EXTRA_ANSWERS: "the report answers test ids the sandbox did not ask about",
    TamperingReason.DUPLICATE_ANSWERS: "the report answers one test id more than once",
}
