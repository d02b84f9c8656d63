"""The Grafana dashboards (charts/kuberl/files/dashboards/*.json): an overview of every job and a per-job
dashboard with a row per tier, on a `datasource` variable, every job query filtered by `namespace` and `rljob`,
and the panels an operator of a job needs. test_live_prometheus.py runs every query against a real Prometheus."""

from __future__ import annotations

import pytest
from monitoring.schema import dashboards, panels, selectors

BOARDS = dashboards()
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def test_an_overview_and_a_per_job_dashboard():
    assert set(BOARDS) == {"kuberl-overview", "kuberl-job"}
    for stem, board in BOARDS.items():
        assert board["uid"] == stem and board["title"].startswith("KubeRL / ")
        assert board["schemaVersion"] >= 39 and board["id"] is None and "kuberl" in board["tags"]


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_variables_datasource_namespace_and_rljob(stem):
    variables = {v["name"]: v for v in BOARDS[stem]["templating"]["list"]}
    assert (variables["datasource"]["type"], variables["datasource"]["query"]) == ("datasource", "prometheus")
    for name in ("namespace", "rljob"):
        var = variables[name]
        assert var["type"] == "query" and var["datasource"] == DATASOURCE
        assert var["query"]["query"].startswith("label_values(kuberl_job_phase") and var["query"]["query"].endswith(
            f", {name})"
        )
    assert "$namespace" in variables["rljob"]["query"]["query"]  # the jobs of the namespaces chosen
    assert variables["namespace"]["multi"] == (stem == "kuberl-overview")  # all jobs; one job


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_every_query_uses_the_datasource_variable_and_is_filtered_by_namespace_and_rljob(stem):
    for panel in panels(BOARDS[stem]):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE
            found = selectors(target["expr"])
            assert found, (panel["title"], target["expr"])
            for selector in found:
                if selector.metric.startswith("kuberl_operator_"):
                    continue  # the operator's own work is not a job's
                matchers = {(label, value) for label, _, value in selector.matchers}
                assert {("namespace", "$namespace"), ("rljob", "$rljob")} <= matchers, (panel["title"], selector)


@pytest.mark.parametrize("stem", sorted(BOARDS))
def test_panels_have_unique_ids_and_fit_the_grid_without_overlapping(stem):
    every = BOARDS[stem]["panels"]
    assert len({p["id"] for p in every}) == len(every)
    cells: set[tuple[int, int]] = set()
    for panel in every:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {(x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])}
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def metrics_in(board: dict, row: str | None = None) -> set[str]:
    """The metrics of a dashboard's queries, or of one row's."""
    current, out = None, set()
    for panel in board["panels"]:
        if panel["type"] == "row":
            current = panel["title"]
            continue
        if row is None or current == row:
            out |= {s.metric for t in panel["targets"] for s in selectors(t["expr"])}
    return out


def exprs(board: dict) -> str:
    return "\n".join(t["expr"] for p in panels(board) for t in p["targets"])


def test_the_overview_shows_phase_step_rate_reward_gpu_hours_and_cost_on_spot():
    board = BOARDS["kuberl-overview"]
    assert {
        "kuberl_job_phase",
        "kuberl_job_step",
        "kuberl_job_reward_mean",
        "kuberl_job_gpu_seconds_total",
        "kuberl_job_restarts_total",
        "kuberl_job_breaker_trips_total",
    } <= metrics_in(board)
    text = exprs(board)
    assert "deriv(kuberl_job_step{" in text  # step rate
    assert "kuberl_job_gpu_seconds_total{" in text and "/ 3600" in text  # GPU-hours
    assert 'capacity="spot"' in text and "$spot_price" in text  # spot share and cost
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"ondemand_price", "spot_price"} <= variables


def test_the_per_job_dashboard_has_a_row_per_tier_with_the_panels_asked_for():
    board = BOARDS["kuberl-job"]
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Job", "Learner", "Rollout", "Sandbox"]
    assert {
        f"kuberl_learner_{m}"
        for m in (
            "loss",
            "reward_mean",
            "kl_reference",
            "mismatch_kl",
            "entropy_nats",
            "step_phase_seconds",
            "trajectory_staleness_versions",
            "checkpoint_last_timestamp_seconds",
        )
    } <= metrics_in(board, "Learner")
    assert {
        f"kuberl_rollout_{m}"
        for m in (
            "generated_tokens_total",
            "active_sessions",
            "queued_trajectories",
            "kv_cache_usage_ratio",
            "weight_sync_seconds",
            "trajectories_total",
        )
    } <= metrics_in(board, "Rollout")
    assert {
        "kuberl_sandbox_sessions_open",
        "kuberl_sandbox_command_duration_seconds",
        "kuberl_sandbox_command_timeouts_total",
        "kuberl_job_ready_workers",
        "kuberl_job_sandbox_desired_replicas",
    } <= metrics_in(board, "Sandbox")
    text = exprs(board)
    for quantile in ("0.5", "0.9", "0.99"):  # command latency quantiles
        assert f"histogram_quantile({quantile}, sum by (le, kind) (rate(kuberl_sandbox_command_duration" in text
    assert "sum by (reason) (rate(kuberl_rollout_trajectories_total{" in text  # failures by reason
    assert "sum by (phase) (rate(kuberl_learner_step_phase_seconds_sum{" in text  # step time breakdown
