"""The monitoring schema as the tests see it: the metrics docs/metrics.md lists, the metrics the code exports,
and the PromQL of the dashboards and alerts in charts/kuberl/files/, with the selectors inside it."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml
from conftest import tool

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "metrics.md"
FILES = REPO / "charts" / "kuberl" / "files"
ALERTS = FILES / "alerts.yaml"
ALERT_TESTS = Path(__file__).with_name("alerts.test.yaml")
DASHBOARDS = sorted((FILES / "dashboards").glob("*.json"))
PARTS = ("operator", "job", "learner", "rollout", "sandbox")
IDENTITY = {"namespace", "rljob", "tier", "pod"}  # the labels a scrape adds (docs/metrics.md, conventions)
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


@dataclass(frozen=True)
class Metric:
    name: str  # as queried: counters with _total, histograms without their series suffix
    type: str  # counter, gauge, histogram
    labels: frozenset[str]
    part: str  # operator, job, learner, rollout, sandbox
    pending: bool = False  # docs/metrics.md "Coming": named by a dashboard or alert, not exported yet


def documented() -> dict[str, Metric]:
    """Every metric docs/metrics.md lists, by name: its table rows, in the section of the part that exports it."""
    metrics: dict[str, Metric] = {}
    section = None
    for line in DOCS.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip().lower()
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| `kuberl_") or len(cells) != 5:
            continue
        name = cells[0].strip("`")
        labels = frozenset(re.findall(r"`(\w+)`", cells[2]))
        pending = section == "coming"
        part = name.split("_")[1] if pending else section
        assert name not in metrics, f"docs/metrics.md lists {name} twice"
        metrics[name] = Metric(name, cells[1], labels, part, pending)
    return metrics


def exposition_families(text: str, part: str, label_names: dict[str, tuple[str, ...]] | None = None) -> dict:
    """The metric families of a /metrics text: {name: Metric}; `label_names` fills in the labels of families
    that have no samples yet (a labelled counter before its first increment)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        labels = {k for s in family.samples for k in s.labels} - {"le", "quantile"}
        if not family.samples and label_names:
            labels = set(label_names.get(name, ()))
        out[name] = Metric(name, family.type, frozenset(labels), part)
    return out


def code_label_names(holder: object) -> dict[str, tuple[str, ...]]:
    """Label names of the prometheus_client metric objects held as attributes of `holder`."""
    from prometheus_client.metrics import MetricWrapperBase

    names = {}
    for metric in vars(holder).values():
        if isinstance(metric, MetricWrapperBase):
            suffix = "_total" if metric._type == "counter" else ""
            names[metric._name + suffix] = tuple(metric._labelnames)
    return names


def tier_expositions() -> dict[str, tuple[str, dict[str, tuple[str, ...]]]]:
    """{part: (/metrics text, label names from the code)} for every part, from the registries their servers
    serve (the learner's, rollout's and sandbox's metrics objects; the operator's registry; the job metrics of a
    status with every field set and a tripped breaker)."""
    from prometheus_client import generate_latest

    import kuberl_operator.operator_metrics as operator_metrics
    from kuberl.job_metrics import JobMetrics
    from kuberl_rollout.metrics import RolloutMetrics
    from kuberl_sandbox.metrics import SandboxMetrics
    from kuberl_trainer.learner_metrics import LearnerMetrics

    out = {}
    for part, holder in (("learner", LearnerMetrics()), ("rollout", RolloutMetrics()), ("sandbox", SandboxMetrics())):
        out[part] = (generate_latest(holder.registry).decode(), code_label_names(holder))
    out["job"] = (generate_latest(job_metrics_registry(JobMetrics)).decode(), {})
    operator_text = generate_latest(operator_metrics.registry).decode()
    out["operator"] = (operator_text, code_label_names(operator_metrics))
    return out


def job_metrics_registry(job_metrics_class):
    from prometheus_client import CollectorRegistry

    from kuberl.api.spec import RLJobSpec
    from kuberl.api.status import RLJobStatus

    registry = CollectorRegistry(auto_describe=True)
    jobs = job_metrics_class(registry)
    status = RLJobStatus.model_validate(
        {
            "phase": "Stopped",
            "reason": "MaxWallClockReached",
            "step": 7,
            "policyVersion": 7,
            "rewardMean": 0.5,
            "tokensPerSecond": 100.0,
            "staleness": 0.5,
            "runningSeconds": 60.0,
            "lastCheckpoint": {"step": 6, "uri": "s3://c/6", "time": "2026-01-01T00:00:00Z"},
            "gpuHoursByTier": {"learner": 1.0},
            "spotGpuHoursByTier": {"learner": 0.5},
            "preemptions": 1,
            "restarts": {"rollout": 1},
            "readyWorkers": {"learner": 1, "rollout": 1, "sandbox": 1},
            "sandboxReplicas": 2,
        }
    )
    jobs.observe("ml", "every-field", status, RLJobSpec())
    return registry


def exported() -> dict[str, Metric]:
    """Every metric the code exports, by name (the operator's registry also holds the job metrics)."""
    metrics: dict[str, Metric] = {}
    for part, (text, label_names) in tier_expositions().items():
        for name, metric in exposition_families(text, part, label_names).items():
            if name.startswith(f"kuberl_{part}_"):
                metrics[name] = metric
    return metrics


def promtool_check_metrics(text: str) -> str:
    """`promtool check metrics` on a /metrics text: its complaints ('' when there are none)."""
    result = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True, text=True)
    return (result.stdout + result.stderr).strip() if result.returncode else ""


# ----------------------------------------------------------------------------------------------- PromQL
_SELECTOR = re.compile(r"\b(kuberl_[a-z0-9_]+)\s*(\{[^{}]*\})?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Selector:
    text: str  # as written
    name: str  # the series name selected (e.g. a histogram's _bucket)
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value)

    @property
    def metric(self) -> str:
        """The schema's metric name: a histogram series without its suffix."""
        for suffix in HISTOGRAM_SERIES:
            if self.name.endswith(suffix) and self.name.removesuffix(suffix) in documented():
                return self.name.removesuffix(suffix)
        return self.name

    def labels(self) -> set[str]:
        return {label for label, _, _ in self.matchers}

    def identity_only(self) -> str:
        """The selector with only its identity matchers (namespace, rljob, tier, pod)."""
        kept = [f'{label}{op}"{value}"' for label, op, value in self.matchers if label in IDENTITY]
        return f"{self.name}{{{', '.join(kept)}}}" if kept else self.name


def selectors(expr: str) -> list[Selector]:
    return [
        Selector(m.group(0), m.group(1), tuple(_MATCHER.findall(m.group(2) or ""))) for m in _SELECTOR.finditer(expr)
    ]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboards() -> dict[str, dict]:
    return {path.stem: json.loads(path.read_text()) for path in DASHBOARDS}


def panels(dashboard: dict) -> list[dict]:
    """Every panel that is not a row, rows' collapsed panels included."""
    out = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            out += panel.get("panels", [])
        else:
            out.append(panel)
    return out


def dashboard_targets() -> list[tuple[str, str, str, str]]:
    """(dashboard, panel title, refId, expr) of every query of every dashboard."""
    return [
        (stem, panel["title"], target["refId"], target["expr"])
        for stem, board in dashboards().items()
        for panel in panels(board)
        for target in panel.get("targets", [])
    ]


def variable_values(dashboard: dict, namespace: str, rljob: str, rate_interval: str) -> dict[str, str]:
    """What Grafana would put in for each variable: the job's names, the variables' defaults, Grafana's own."""
    values = {
        "namespace": namespace,
        "rljob": rljob,
        "__rate_interval": rate_interval,
        "__interval": "15s",
        "__range": "1h",
    }
    for var in dashboard["templating"]["list"]:
        if var["type"] in ("textbox", "constant", "custom"):
            values[var["name"]] = str(var["current"]["value"])
    return values


def substitute(expr: str, values: dict[str, str]) -> str:
    """`$name` and `${name}` replaced, longest names first (so `$__rate_interval` is not `$__rate` + ...)."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    assert "$" not in expr, f"a variable without a value in {expr}"
    return expr
