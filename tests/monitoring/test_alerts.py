"""The alerts (charts/kuberl/files/alerts.yaml): a valid Prometheus rule file, each alert labelled and
annotated for the person it pages, and unit-tested with promtool, firing and staying quiet."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from conftest import tool
from monitoring.schema import ALERT_TESTS, ALERTS, alert_rules, selectors

# Every alert the operator ships, by what it watches.
EXPECTED = {
    "KubeRLJobFailed",
    "KubeRLJobStoppedByBreaker",
    "KubeRLJobNoTrainingProgress",
    "KubeRLCheckpointTooOld",
    "KubeRLStalenessAboveBound",
    "KubeRLRolloutFailureRateHigh",
    "KubeRLSandboxTimeoutsHigh",
    "KubeRLSandboxImageStarved",
    "KubeRLSandboxPoolsCapped",
    "KubeRLRewardTampering",
    "KubeRLOperatorDown",
    "KubeRLOperatorReconcileErrors",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("promtool"), *args], capture_output=True, text=True, timeout=120)


def test_promtool_check_rules_passes():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(EXPECTED)} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = promtool("test", "rules", str(ALERT_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_alerts_are_the_ones_asked_for():
    assert {rule["alert"] for rule in alert_rules()} == EXPECTED


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_each_alert_says_how_bad_and_which_job(rule):
    assert rule["labels"]["severity"] in ("critical", "warning")
    assert set(rule["annotations"]) >= {"summary", "description"}
    job_scoped = any(s.metric.split("_")[1] != "operator" for s in selectors(rule["expr"]))
    for text in (rule["annotations"]["summary"], rule["annotations"]["description"]):
        if job_scoped:
            assert "{{ $labels.rljob }}" in text and "{{ $labels.namespace }}" in text, text
    # a `for` of at least a minute: one bad scrape or evaluation does not page anyone
    assert rule["for"].endswith("m") and int(rule["for"][:-1]) >= 1
    if job_scoped:  # one alert per job, whatever pods it has
        assert "by (namespace, rljob" in rule["expr"] or "on (namespace, rljob)" in rule["expr"], rule["expr"]


def test_every_alert_has_unit_tests_that_fire_it_and_keep_it_quiet():
    cases = [case for test in yaml.safe_load(ALERT_TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    for alert in EXPECTED:
        mine = [case for case in cases if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in mine), f"{alert}: no unit test fires it"
        assert any(not case["exp_alerts"] for case in mine), f"{alert}: no unit test where it stays quiet"
        for case in mine:
            for expected in case["exp_alerts"]:  # the annotations are rendered and checked, not only the labels
                assert set(expected.get("exp_annotations", {})) == {"summary", "description"}, (alert, case)
