"""The tampering reasons: one fixed set the sandbox, the rollout tier and the docs share."""

from __future__ import annotations

from conftest import REPO

from kuberl.api.tampering import DESCRIPTIONS, TamperingReason


def test_the_reasons_are_the_fixed_set_the_sandbox_names():
    assert [r.value for r in TamperingReason] == [
        "no_report",
        "several_reports",
        "malformed_report",
        "missing_answers",
        "extra_answers",
        "duplicate_answers",
    ]
    assert TamperingReason("missing_answers") is TamperingReason.MISSING_ANSWERS
    assert TamperingReason.EXTRA_ANSWERS == "extra_answers"  # a StrEnum: the value is what goes on the wire


def test_every_reason_has_a_one_line_description():
    assert set(DESCRIPTIONS) == set(TamperingReason)
    for reason in TamperingReason:
        assert reason.description and "\n" not in reason.description and len(reason.description) < 100, reason


def test_docs_metrics_lists_every_reason_with_its_description():
    docs = (REPO / "docs" / "metrics.md").read_text()
    for reason in TamperingReason:
        description = reason.description[0].upper() + reason.description[1:]
        assert f"| `{reason.value}` | {description} |" in docs, reason
    row = next(line for line in docs.splitlines() if line.startswith("| `kuberl_sandbox_tampering_total`"))
    assert ", ".join(r.value for r in TamperingReason) in row
