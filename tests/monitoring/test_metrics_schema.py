"""docs/metrics.md is the one metrics schema: every metric it lists is exported by the part it is listed
under, with that type and those labels, and every metric a part exports is listed (both ways). Every metric
a dashboard or an alert names is listed and exported. `promtool check metrics` finds no naming problem in any
part's /metrics text: the tiers' registries (what their servers serve), a real sandbox server, the job metrics
`kuberl run --metrics-port` serves, and a real operator driving a job on the emulated API server."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml
from monitoring.emulated_operator import OPERATOR_JOB, operator_fixture  # noqa: F401  (the `operator` fixture)
from monitoring.schema import (
    PARTS,
    alert_rules,
    dashboard_targets,
    documented,
    exported,
    exposition_families,
    promtool_check_metrics,
    selectors,
    tier_expositions,
)

from kuberl.api.rljob import RLJob
from kuberl_app.one_machine.runner import RunMetrics
from kuberl_sandbox.local import free_port


@pytest.fixture(scope="module")
def docs():
    return documented()


@pytest.fixture(scope="module")
def code():
    return exported()


def test_every_documented_metric_is_exported_as_documented(docs, code):
    for name, metric in docs.items():
        if metric.pending:
            continue  # "Coming": checked once a part exports it (next test)
        assert name in code, f"docs/metrics.md lists {name} ({metric.part}); no part exports it"
        assert (code[name].part, code[name].type) == (metric.part, metric.type), (name, code[name], metric)
        assert code[name].labels == metric.labels, (
            f"{name}: docs say labels {sorted(metric.labels)}, the code has {sorted(code[name].labels)}"
        )


def test_every_exported_metric_is_documented_in_its_part(docs, code):
    missing = sorted(set(code) - set(docs))
    assert not missing, f"exported but not in docs/metrics.md: {missing}"
    for name, metric in code.items():
        assert docs[name].part == metric.part and docs[name].type == metric.type, (name, docs[name], metric)
        assert docs[name].labels == metric.labels, name
        assert not docs[name].pending, f"{name} is exported now: move it from 'Coming' to section {metric.part!r}"


def test_docs_follow_the_naming_conventions(docs):
    assert {m.part for m in docs.values()} == set(PARTS)
    for name, metric in docs.items():
        assert name.startswith(f"kuberl_{metric.part}_"), name
        assert metric.type in ("counter", "gauge", "histogram"), name
        assert name.endswith("_total") == (metric.type == "counter"), f"{name}: only counters end in _total"
        assert "job" not in metric.labels, f"{name}: `job` is Prometheus' scrape job; the RLJob is `rljob`"
        assert not name.endswith(("_milliseconds", "_ms", "_minutes", "_hours", "_percent", "_kilobytes")), name
        if metric.part == "job":
            assert {"namespace", "rljob"} <= metric.labels, f"{name}: a job metric carries namespace and rljob"


def test_every_metric_the_dashboards_and_alerts_use_is_documented_and_exported(docs, code):
    used = {(s.metric, where) for where, expr in _queries() for s in selectors(expr)}
    for metric, where in sorted(used):
        assert metric in docs, f"{where} uses {metric}, which docs/metrics.md does not list"
        assert metric in code or docs[metric].pending, f"{where} uses {metric}, which no part exports"


def test_every_part_is_on_a_dashboard():
    used = {s.metric for _, expr in _queries(alerts=False) for s in selectors(expr)}
    assert {metric.split("_")[1] for metric in used} == set(PARTS)


@pytest.mark.parametrize("part", PARTS)
def test_promtool_finds_no_naming_problem_in_the_registries(part):
    text, _ = tier_expositions()[part]
    assert "kuberl_" in text
    assert promtool_check_metrics(text) == ""


def test_a_real_sandbox_server_exports_its_documented_metrics(sandbox, docs):
    with urllib.request.urlopen(f"{sandbox.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert promtool_check_metrics(text) == ""
    served = {n for n in exposition_families(text, "sandbox") if n.startswith("kuberl_")}
    assert served == {n for n, m in docs.items() if m.part == "sandbox"}


def test_kuberl_run_serves_the_job_metrics_of_its_job(tmp_path, docs):
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": "local", "namespace": "ml"},
        "spec": {"model": {"uri": "s3://models/tiny"}},
    }
    (tmp_path / "status.json").write_text(json.dumps({"phase": "Running", "step": 3, "rewardMean": 0.25}))
    metrics = RunMetrics(RLJob.from_manifest(manifest), tmp_path, port := free_port())
    try:
        metrics.publish("Running", 12.0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            text = response.read().decode()
    finally:
        metrics.close()
    assert promtool_check_metrics(text) == ""
    assert 'kuberl_job_step{namespace="ml",rljob="local"} 3.0' in text
    assert 'kuberl_job_phase{namespace="ml",phase="Running",rljob="local"} 1.0' in text
    assert set(exposition_families(text, "job")) <= {n for n, m in docs.items() if m.part == "job"}


def test_a_real_operator_exports_its_and_its_jobs_documented_metrics(operator, docs):
    text = operator.metrics_text()
    assert promtool_check_metrics(text) == ""
    families = exposition_families(text, "operator")
    namespace, name = OPERATOR_JOB
    assert f'kuberl_job_phase{{namespace="{namespace}",phase="Pending",rljob="{name}"}}' in text
    for metric in families:
        assert metric in docs and docs[metric].part in ("operator", "job"), metric
    assert {n for n, m in docs.items() if m.part == "operator"} <= set(families)


def _queries(alerts: bool = True) -> list[tuple[str, str]]:
    out = [(f"dashboard {stem} panel {title!r} ({ref})", expr) for stem, title, ref, expr in dashboard_targets()]
    if alerts:
        out += [(f"alert {rule['alert']}", rule["expr"]) for rule in alert_rules()]
    return out


def test_the_alert_file_is_a_rule_file_the_chart_can_take_as_it_is():
    from monitoring.schema import ALERTS

    document = yaml.safe_load(ALERTS.read_text())
    assert list(document) == ["groups"]
