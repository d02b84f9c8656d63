"""The local supervisor with real processes (small HTTP servers): readiness, restarts with back-off,
the retry budget, liveness probes, and stopping everything."""

from __future__ import annotations

import sys
import time

import pytest

from kuberl.local import supervisor as supervision
from kuberl.local.processes import ProcessSpec
from kuberl.local.supervisor import RetryBudgetExhausted, Supervisor
from kuberl_sandbox.local import free_port


def server(tmp_path, name: str, tier: str = "rollout", live: str | None = None) -> ProcessSpec:
    port = free_port()
    (tmp_path / "ok").write_text("ok")
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    url = f"http://127.0.0.1:{port}"
    return ProcessSpec(name, tier, argv, {}, f"{url}/ok", tmp_path / f"{name}.log", live and f"{url}/{live}")


def until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_crashed_process_is_restarted_after_its_back_off_and_counted(tmp_path):
    s = Supervisor([server(tmp_path, "rollout-0")], retry_budget=3, log=lambda _: None)
    s.start("rollout-0")
    try:
        s.kill("rollout-0")
        until(lambda: bool(s.poll()))  # the exit is seen ...
        assert not s.running("rollout-0")
        until(lambda: s.poll() == [] and s.running("rollout-0"))  # ... and after ~1 s it is back, ready
        assert s.restarts == {"rollout": 1}
        assert [e["event"] for e in s.events] == ["started", "ready", "exited", "started", "ready", "restarted"]
    finally:
        s.stop_all()
    assert not s.running("rollout-0")


def test_the_retry_budget_fails_the_job(tmp_path, monkeypatch):
    monkeypatch.setattr(supervision, "BACKOFF_START_S", 0.01)
    s = Supervisor([server(tmp_path, "sandbox-0", "sandbox")], retry_budget=1, log=lambda _: None)
    s.start("sandbox-0")
    try:
        s.kill("sandbox-0")
        until(lambda: bool(s.poll()))  # exited (restart 1 of 1) ...
        until(lambda: s.poll() == [] and s.running("sandbox-0"))  # ... and back
        s.kill("sandbox-0")
        with pytest.raises(RetryBudgetExhausted, match=r"exceed limits.retryBudget \(1\)"):
            until(lambda: bool(s.poll()) and False)
    finally:
        s.stop_all()


def test_a_process_failing_its_liveness_probe_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(supervision, "LIVENESS_PERIOD_S", 0.05)
    monkeypatch.setattr(supervision, "BACKOFF_START_S", 0.01)
    s = Supervisor([server(tmp_path, "rollout-0", live="missing")], retry_budget=5, log=lambda _: None)
    s.start("rollout-0")
    try:
        until(lambda: s.poll() is not None and any(e["event"] == "liveness-failed" for e in s.events))
        until(lambda: s.poll() == [] and s.running("rollout-0") and s.restarts["rollout"] == 1)
    finally:
        s.stop_all()


def test_a_learner_that_exits_cleanly_is_not_restarted(tmp_path):
    spec = ProcessSpec("learner", "learner", [sys.executable, "-c", "pass"], {}, None, tmp_path / "learner.log")
    s = Supervisor([spec], retry_budget=0, log=lambda _: None)
    s.start("learner")
    until(lambda: s.poll() == [("learner", 0)])
    time.sleep(0.2)
    assert s.poll() == [] and not s.running("learner") and not s.restarts
