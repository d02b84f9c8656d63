"""The local supervisor with real processes (small HTTP servers): readiness, restarts with back-off,
the retry budget, liveness probes, and stopping everything."""

from __future__ import annotations

import sys
import time

import pytest

from kuberl_app.one_machine import supervisor as supervision
from kuberl_app.one_machine.processes import ProcessSpec
from kuberl_app.one_machine.supervisor import RetryBudgetExhausted, Supervisor
from kuberl_sandbox.local import free_port


def server(tmp_path, name: str, tier: str = "rollout", live: str | None = None, delay_s: float = 0) -> ProcessSpec:
    """A small HTTP server that starts listening `delay_s` after it is started (a model loading)."""
    port = free_port()
    (tmp_path / "ok").write_text("ok")
    serve = f"{sys.executable} -m http.server {port} --bind 127.0.0.1 --directory {tmp_path}"
    argv = ["sh", "-c", f"sleep {delay_s}; exec {serve}"]
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
        until(lambda: s.poll() == [] and s.ready("rollout-0"))  # ... and after ~1 s it is back, ready
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
        until(lambda: s.poll() == [] and s.ready("sandbox-0"))  # ... and back
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
        until(lambda: s.poll() == [] and s.ready("rollout-0") and s.restarts["rollout"] == 1)
    finally:
        s.stop_all()


def test_a_preempted_process_is_not_probed_while_it_shuts_down(tmp_path, monkeypatch):
    """Preempted, a server stops answering before it exits (vLLM's shutdown): its failed probes in the notice
    must not turn the preemption into a liveness kill."""
    monkeypatch.setattr(supervision, "LIVENESS_PERIOD_S", 0.05)
    lines: list[str] = []
    spec = server(tmp_path, "rollout-0", live="ok")
    # the preemption notice's SIGTERM closes the port at once and the process lingers a while, answering nothing
    spec.argv[:] = ["sh", "-c", f"trap 'kill $child; sleep 1; exit 0' TERM; {spec.argv[2]} & child=$!; wait $child"]
    s = Supervisor([spec], retry_budget=0, log=lines.append)
    s.start("rollout-0")
    try:
        s.preempt("rollout-0")
        until(lambda: s.poll() == [("rollout-0", 0)])
        assert not any(e["event"] == "liveness-failed" for e in s.events) and s.preemptions == {"rollout": 1}
        assert lines == ["rollout-0 preempted; starting its replacement"]
    finally:
        s.stop_all()


def test_a_learner_that_exits_cleanly_is_not_restarted(tmp_path):
    spec = ProcessSpec("learner", "learner", [sys.executable, "-c", "pass"], {}, None, tmp_path / "learner.log")
    s = Supervisor([spec], retry_budget=0, log=lambda _: None)
    s.start("learner")
    until(lambda: s.poll() == [("learner", 0)])
    time.sleep(0.2)
    assert s.poll() == [] and not s.running("learner") and not s.restarts


def test_a_restart_is_probed_from_poll_without_holding_the_caller(tmp_path, monkeypatch):
    """`kuberl run`'s monitor calls `poll` twice a second to follow the learner and check the breakers: a
    replacement that takes seconds to become ready must not hold it (a vLLM server takes half a minute)."""
    monkeypatch.setattr(supervision, "BACKOFF_START_S", 0.01)
    s = Supervisor([server(tmp_path, "rollout-0", delay_s=2)], retry_budget=3, log=lambda _: None)
    s.start("rollout-0")
    try:
        s.kill("rollout-0")
        until(lambda: bool(s.poll()))
        slowest, polls = 0.0, 0
        while not s.ready("rollout-0"):
            began = time.monotonic()
            assert s.poll() == []
            slowest, polls = max(slowest, time.monotonic() - began), polls + 1
            time.sleep(0.05)
        assert s.running("rollout-0") and polls > 10 and slowest < 1.0, (polls, slowest)
        assert [e["event"] for e in s.events][-3:] == ["started", "ready", "restarted"]
    finally:
        s.stop_all()


def test_a_replacement_that_dies_or_hangs_while_starting_counts_as_a_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(supervision, "BACKOFF_START_S", 0.01)
    monkeypatch.setattr(supervision, "READY_TIMEOUT_S", 0.5)
    spec = server(tmp_path, "rollout-0", delay_s=0)
    s = Supervisor([spec], retry_budget=5, log=lambda _: None)
    s.start("rollout-0")
    try:
        spec.argv[:] = ["sh", "-c", "sleep 30"]  # the replacement never listens: killed at its deadline
        s.kill("rollout-0")
        until(lambda: s.poll() is not None and s.restarts["rollout"] == 2)
        spec.argv[:] = ["sh", "-c", "exit 3"]  # the next one exits while starting
        until(lambda: s.poll() is not None and s.restarts["rollout"] == 3)
        assert not s.ready("rollout-0")
        assert ("rollout-0", "exited", 3) in [(e["process"], e["event"], e.get("code")) for e in s.events]
    finally:
        s.stop_all()


def test_a_process_asked_to_stop_is_not_restarted_whatever_its_exit_code(tmp_path):
    """A breaker stops the learner: its exit (here by the signal itself, -15) reads as a stop, not a crash."""
    spec = ProcessSpec("learner", "learner", ["sleep", "60"], {}, None, tmp_path / "learner.log")
    lines: list[str] = []
    s = Supervisor([spec], retry_budget=0, log=lines.append)
    s.start("learner")
    try:
        s.stop("learner")
        until(lambda: s.poll() == [("learner", -15)])
        time.sleep(0.2)
        assert s.poll() == [] and not s.running("learner")
        assert s.restarts == {} and lines == ["learner stopped (exit -15)"]
    finally:
        s.stop_all()
