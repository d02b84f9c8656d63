"""The dashboards and alerts against a real Prometheus that scrapes a real `kuberl run` of a short job (tiny
random Llama, 12 steps, stopped by its maxSteps breaker) and a real operator driving a job on the emulated
API server: every dashboard query returns data, every alert expression evaluates and each metric selector in it
returns data, the series carry the labels docs/metrics.md promises, and `promtool check metrics` passes on every
part's real /metrics text."""

from __future__ import annotations

import json
import math
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import yaml
from conftest import tool
from helpers.tiny_job import tiny_job_spec
from monitoring.emulated_operator import OPERATOR_JOB, OperatorEndpoint, operator_fixture  # noqa: F401
from monitoring.schema import (
    ALERTS,
    alert_rules,
    dashboard_targets,
    dashboards,
    documented,
    exported,
    promtool_check_metrics,
    selectors,
    substitute,
    variable_values,
)

from kuberl.http_probes import answers
from kuberl_sandbox.local import free_port
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow

NAMESPACE, RLJOB = "rl-live", "live"
SCRAPE = "1s"
RATE_INTERVAL = "15s"  # what Grafana's $__rate_interval is at 1 s scrapes (4 x the interval, rounded up)
RUN_TIMEOUT_S = 240
# Series that appear with their first event (the tier does not export these label values at 0 from the
# start), which a healthy short run never has and the test cannot cause from outside: a selector of them that
# returns nothing is reported, not failed. (The sandbox's are caused: drive_the_sandbox.)
EVENT_ONLY: set[str] = {
    # environment images with a sandbox pool of their own (docs/sandbox-pools.md): a run on the default pool has none
    'kuberl_rollout_queued_trajectories{image!=""}',
    "kuberl_operator_sandbox_pool_ready_pods",
}


@dataclass
class LiveRun:
    prometheus: str
    start: float
    end: float = 0.0
    texts: dict[str, str] = field(default_factory=dict)  # pod (or "operator") -> its /metrics text

    def query_range(self, expr: str) -> list[dict]:
        response = httpx.get(
            f"{self.prometheus}/api/v1/query_range",
            timeout=30,
            params={"query": expr, "start": self.start, "end": self.end, "step": "1s"},
        )
        body = response.json()
        assert body["status"] == "success", f"{expr}: {body.get('error')}"
        return body["data"]["result"]

    def query(self, expr: str) -> dict:
        response = httpx.get(f"{self.prometheus}/api/v1/query", params={"query": expr, "time": self.end}, timeout=30)
        return response.json()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, operator: OperatorEndpoint) -> Iterator[LiveRun]:
    folder = tmp_path_factory.mktemp("live")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=4)
    # 12 steps: long enough for the test to read every part's /metrics while the run is alive (a step of the
    # tiny model takes well under a second)
    spec = tiny_job_spec(model, training={"totalSteps": 12}, checkpoint={"intervalSteps": 1}, limits={"maxSteps": 12})
    manifest = {
        "apiVersion": "kuberl.io/v1alpha1",
        "kind": "RLJob",
        "metadata": {"name": RLJOB, "namespace": NAMESPACE},
        "spec": spec,
    }
    (folder / "job.yaml").write_text(yaml.safe_dump(manifest))
    run_dir = folder / "run"
    argv = [
        sys.executable,
        "-m",
        "kuberl_app.cli",
        "run",
        str(folder / "job.yaml"),
        "--run-dir",
        str(run_dir),
        "--no-evaluate",
        "--metrics-port",
        str(free_port()),
        "--metrics-linger",
        "5s",
    ]
    token = secrets.token_hex(16)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "KUBERL_SANDBOX_TOKEN": token}
    run = subprocess.Popen(argv, env=env, stdout=(folder / "run.log").open("w"), stderr=subprocess.STDOUT)
    prometheus = None
    try:
        targets_file = run_dir / "prometheus_targets.json"
        wait_for(lambda: targets_file.exists() or run.poll() is not None, 60, "prometheus_targets.json")
        prometheus, url = start_prometheus(folder, targets_file, operator.port)
        result = LiveRun(url, time.time())
        targets = json.loads(targets_file.read_text())
        sandbox = next(t["targets"][0] for t in targets if t["labels"]["pod"] == "sandbox-0")
        wait_for(lambda: answers(f"http://{sandbox}/readyz", timeout=1) or run.poll() is not None, 60, "the sandbox")

        # Prometheus sees the sandbox's counters at 0 before the commands, so that their rates have an increase
        def scraped():
            return httpx.get(
                f"{url}/api/v1/query",
                params={"query": "kuberl_sandbox_commands_total"},
                timeout=10,
            ).json()["data"]["result"]

        wait_for(lambda: scraped() or run.poll() is not None, 60, "a scrape of the sandbox")
        drive_the_sandbox(sandbox, token)  # the sandbox starts first: no need to wait for training
        # every part's /metrics text once the first step is done (all of them are up then)
        wait_for(lambda: (run_dir / "metrics.jsonl").exists() or run.poll() is not None, RUN_TIMEOUT_S, "a step")
        assert run.poll() is None, "the run ended before its metrics could be read: " + (folder / "run.log").read_text()
        for target in targets:
            result.texts[target["labels"]["pod"]] = httpx.get(f"http://{target['targets'][0]}/metrics").text
        result.texts["operator"] = operator.metrics_text()
        run.wait(RUN_TIMEOUT_S)
        record = json.loads((run_dir / "job.json").read_text())
        assert (record["phase"], record["reason"]) == ("Stopped", "MaxStepsReached"), (folder / "run.log").read_text()
        time.sleep(2)  # the last scrapes and rule evaluations
        result.end = time.time()
        print(f"\nlive run: {result.end - result.start:.0f} s scraped; run log {folder / 'run.log'}")
        yield result
    finally:
        if run.poll() is None:
            run.send_signal(signal.SIGINT)
            run.wait(120)
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(30)


def start_prometheus(folder: Path, targets_file: Path, operator_port: int) -> tuple[subprocess.Popen, str]:
    """Prometheus scraping the run (its file_sd targets, as written) and the operator (honor_labels, like the
    chart's ServiceMonitor), evaluating the alert rules."""
    config = {
        "global": {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {"job_name": "kuberl-run", "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "1s"}]},
            {
                "job_name": "kuberl-operator",
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{operator_port}"], "labels": {"namespace": "kuberl-system"}}
                ],
            },
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    check = subprocess.run([tool("promtool"), "check", "config", str(folder / "prometheus.yml")], capture_output=True)
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    process = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        stdout=(folder / "prometheus.log").open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        return answers(f"{url}/-/ready", timeout=1) or process.poll() is not None

    wait_for(ready, 30, "prometheus")
    assert process.poll() is None, (folder / "prometheus.log").read_text()
    return process, url


def drive_the_sandbox(address: str, token: str) -> None:
    """What the random policy never does: a command of every kind, one that times out and a request that
    fails, so that the sandbox's command, timeout and error series exist (they appear with their first event)."""
    from kuberl.suites import load_tasks

    with httpx.Client(base_url=f"http://{address}", headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        task = load_tasks("swe-toy", None, "train")[0]
        session = http.post("/v1/sessions", json={"task": task.to_manifest()}).raise_for_status().json()["sessionId"]
        http.post(f"/v1/sessions/{session}/exec", json={"command": "echo hello"}).raise_for_status()
        http.post(f"/v1/sessions/{session}/exec", json={"command": "sleep 5", "timeout": 0.5}).raise_for_status()
        http.post(f"/v1/sessions/{session}/tests", json={}).raise_for_status()
        http.post(f"/v1/sessions/{session}/tests", json={"hidden": True}).raise_for_status()
        assert http.get("/v1/sessions/no-such-session").status_code == 404


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def has_numbers(result: list[dict]) -> bool:
    return any(not math.isnan(float(value)) for series in result for _, value in series["values"])


def test_every_endpoint_of_the_run_and_the_operator_was_scraped(live):
    up = {
        (s["metric"]["job"], s["metric"].get("pod", "")): max(float(v) for _, v in s["values"])
        for s in live.query_range("up")
    }
    assert up == {
        ("kuberl-run", "sandbox-0"): 1,
        ("kuberl-run", "rollout-0"): 1,
        ("kuberl-run", "learner"): 1,
        ("kuberl-run", "kuberl-run"): 1,
        ("kuberl-operator", ""): 1,
    }


def test_series_carry_namespace_rljob_and_tier(live):
    assert not live.query_range('{__name__=~"kuberl_(learner|rollout|sandbox)_.+", tier=""}')
    assert not live.query_range('{__name__=~"kuberl_(job|learner|rollout|sandbox)_.+", rljob=""}')
    assert not live.query_range('{__name__=~"kuberl_.+", exported_namespace!=""}')  # honor_labels kept them
    for tier in ("learner", "rollout", "sandbox"):
        ids = f'namespace="{NAMESPACE}", rljob="{RLJOB}", tier="{tier}"'
        assert live.query_range(f'{{__name__=~"kuberl_{tier}_.+", {ids}}}'), tier
    namespace, name = OPERATOR_JOB
    assert live.query_range(f'kuberl_job_phase{{namespace="{namespace}", rljob="{name}"}}')  # the operator's job
    assert live.query_range(f'kuberl_job_phase{{namespace="{NAMESPACE}", rljob="{RLJOB}", phase="Running"}} == 1')
    assert live.query_range('kuberl_operator_reconcile_duration_seconds_count{namespace="kuberl-system"}')


def test_every_dashboard_query_returns_data(live):
    boards = dashboards()
    empty = []
    for stem, title, ref, expr in dashboard_targets():
        query = substitute(expr, variable_values(boards[stem], NAMESPACE, RLJOB, RATE_INTERVAL))
        if not has_numbers(live.query_range(query)):
            empty.append(f"{stem} / {title} ({ref}): {query}")
    count = len(dashboard_targets())
    print(f"{count} dashboard queries checked")
    assert not empty, f"{len(empty)} of {count} dashboard queries returned no data:\n" + "\n".join(empty)


def test_every_alert_evaluates_and_each_of_its_selectors_returns_data(live):
    pending = {name for name, metric in documented().items() if metric.pending and name not in exported()}
    missing, reported = [], []
    for rule in alert_rules():
        body = live.query(rule["expr"])
        assert body["status"] == "success", f"{rule['alert']}: {body.get('error')}"
        for selector in selectors(rule["expr"]):
            if selector.metric in pending:
                reported.append(f"{rule['alert']}: {selector.text} (not exported yet)")
            elif not live.query_range(selector.text):
                (reported if selector.text in EVENT_ONLY else missing).append(f"{rule['alert']}: {selector.text}")
    print("selectors without data, allowed:\n  " + "\n  ".join(reported))
    assert not missing, "alert selectors that returned no data:\n" + "\n".join(missing)
    # Prometheus itself evaluated every rule on the run's series, without an error
    rules = httpx.get(f"{live.prometheus}/api/v1/rules", timeout=30).json()["data"]["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in rules for r in g["rules"]}
    assert health == {rule["alert"]: ("ok", "") for rule in alert_rules()}


def test_promtool_finds_no_naming_problem_in_any_real_metrics_text(live):
    assert set(live.texts) == {"sandbox-0", "rollout-0", "learner", "kuberl-run", "operator"}
    for pod, text in live.texts.items():
        assert "kuberl_" in text, pod
        assert promtool_check_metrics(text) == "", pod
