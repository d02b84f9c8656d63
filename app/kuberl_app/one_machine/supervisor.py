"""Keeping the job's processes running like Kubernetes would: start them in order, wait for readiness,
restart a process that exits with exponential back-off, and count restarts per tier against the job's
retry budget. Processes run in their own session so a Ctrl-C reaches only `kuberl run`, which stops
them in order."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass

from kuberl.http_probes import answers, wait_until_ready
from kuberl_app.one_machine.processes import ProcessSpec

BACKOFF_START_S, BACKOFF_MAX_S = 1.0, 30.0
LIVENESS_PERIOD_S, LIVENESS_FAILURES = 5.0, 3
READY_TIMEOUT_S = 300.0  # a vLLM server loading a model on a busy CPU
PREEMPTION_GRACE_S = 30.0  # a GKE spot node gives 30 s of notice, AWS 2 minutes: the shorter one


class RetryBudgetExhausted(RuntimeError):
    pass


@dataclass
class Managed:
    spec: ProcessSpec
    proc: subprocess.Popen | None = None
    failures: int = 0  # consecutive, for the back-off
    restart_at: float | None = None  # when a crashed process may start again
    finished: bool = False  # exited and is not to be restarted (the learner's clean stop)
    live_failures: int = 0
    next_probe: float = 0.0
    preempted_at: float | None = None  # a preemption notice was given: its exit is not a failure
    ready_by: float | None = None  # a restarted process is starting: ready before this, or it failed to start
    last_group: int | None = None  # the process group of the last run, until none of it is left
    stopping: bool = False  # asked to stop (a breaker, Ctrl-C): however it exits, it is not restarted


class Supervisor:
    def __init__(self, specs: list[ProcessSpec], retry_budget: int, log=print) -> None:
        self.managed = {s.name: Managed(s) for s in specs}
        self.retry_budget, self.log = retry_budget, log
        self.restarts: Counter[str] = Counter()  # per tier
        self.preemptions: Counter[str] = Counter()  # per tier; never against the retry budget
        self.events: list[dict] = []  # (time, what) of every start, exit and restart, for the run's record

    def start(self, name: str, ready_timeout: float = READY_TIMEOUT_S) -> None:
        """Start one process and wait until its readiness URL answers (if it has one): the job's first start,
        in order. A restart does not wait here: `poll` probes its readiness, so a vLLM server starting for
        half a minute does not hold the caller's watch over the rest of the job."""
        m = self.managed[name]
        self._launch(m)
        if m.spec.ready_url:
            self._wait_ready(m, ready_timeout)
            self._became_ready(m)

    def _launch(self, m: Managed) -> None:
        m.spec.log.parent.mkdir(parents=True, exist_ok=True)
        with m.spec.log.open("a") as out:
            m.proc = subprocess.Popen(
                m.spec.argv,
                env={**os.environ, **m.spec.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        if m.spec.cpus:  # before it starts a thread or a process: they inherit the mask
            os.sched_setaffinity(m.proc.pid, m.spec.cpus)
        m.restart_at, m.finished, m.live_failures = None, False, 0
        m.next_probe = time.monotonic() + LIVENESS_PERIOD_S
        self._event(m.spec.name, "started", pid=m.proc.pid)

    def _became_ready(self, m: Managed) -> None:
        m.failures, m.ready_by = 0, None
        m.next_probe = time.monotonic() + LIVENESS_PERIOD_S
        self._event(m.spec.name, "ready")

    def poll(self) -> list[tuple[str, int]]:
        """Restart what crashed (after its back-off); returns (name, exit code) of processes that exited
        since the last poll. The learner exiting 0 and a process asked to stop are not restarted: they ended
        on purpose."""
        exited = []
        now = time.monotonic()
        for name, m in self.managed.items():
            if m.proc is not None and m.proc.poll() is not None:
                code = m.proc.returncode
                m.proc, m.last_group = None, m.proc.pid  # its own session: the group id is its pid
                exited.append((name, code))
                self._event(name, "exited", code=code)
                starting, m.ready_by = m.ready_by is not None, None
                if m.stopping:
                    m.finished = True
                    if code != 0:
                        self.log(f"{name} stopped (exit {code})")
                    continue
                if m.preempted_at is not None:
                    # replaced at once (capacity elsewhere), counted apart, as the operator does for pods
                    # with a DisruptionTarget condition
                    m.preempted_at, m.restart_at = None, now
                    self.preemptions[m.spec.tier] += 1
                    self.log(f"{name} preempted; starting its replacement")
                    continue
                if m.spec.tier == "learner" and code == 0 and not starting:
                    m.finished = True
                    continue
                self._schedule_restart(m, f"exited with {code}" + (" while starting" if starting else ""))
            elif m.proc is not None and m.preempted_at is not None and now - m.preempted_at >= PREEMPTION_GRACE_S:
                self.signal(name, signal.SIGKILL)  # the notice ran out, as a reclaimed node's does
            elif m.proc is not None and m.ready_by is not None:
                self._probe_ready(m, now)
            elif m.proc is not None and m.spec.live_url and now >= m.next_probe and not self._leaving(m):
                self._probe(m, now)
            elif m.proc is None and m.restart_at is not None and now >= m.restart_at:
                self._clear_group(m)
                self._launch(m)
                if m.spec.ready_url:
                    m.ready_by = now + READY_TIMEOUT_S  # probed from the next poll on
                else:
                    self._event(name, "restarted")
        return exited

    def _probe_ready(self, m: Managed, now: float) -> None:
        """One readiness probe of a restarting process: ready, still starting, or out of time: killed, and the
        next poll sees it exit while starting and counts it as a crash, as after a failed liveness probe."""
        if answers(m.spec.ready_url, timeout=0.5):
            self._became_ready(m)
            self._event(m.spec.name, "restarted")
        elif now >= m.ready_by:
            self.log(f"{m.spec.name} not ready after {READY_TIMEOUT_S:.0f} s ({m.spec.ready_url}); killing it")
            self.signal(m.spec.name, signal.SIGKILL)

    def _clear_group(self, m: Managed, timeout: float = 15.0) -> None:
        """What is left of the last run's process group (a server's workers dying slowly, under load, after
        its main process was killed) still holds its port: kill it and wait until it is gone, so that the
        replacement does not fail to bind the same port."""
        if m.last_group is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(m.last_group, signal.SIGKILL)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        m.last_group = None

    @staticmethod
    def _leaving(m: Managed) -> bool:
        """Preempted or asked to stop: shutting down, it may stop answering before it exits. Like a kubelet
        with a terminating pod, its liveness is not probed: it is not killed for failing probes it must fail."""
        return m.preempted_at is not None or m.stopping

    def _probe(self, m: Managed, now: float) -> None:
        """Liveness, like a kubelet's: a process that keeps failing its probe is killed (then restarted)."""
        m.next_probe = now + LIVENESS_PERIOD_S
        alive = answers(m.spec.live_url, timeout=2.0)
        m.live_failures = 0 if alive else m.live_failures + 1
        if m.live_failures >= LIVENESS_FAILURES:
            self.log(f"{m.spec.name} failed {m.live_failures} liveness probes ({m.spec.live_url}); killing it")
            self._event(m.spec.name, "liveness-failed")
            m.live_failures = 0
            self.signal(m.spec.name, signal.SIGKILL)

    def _schedule_restart(self, m: Managed, why: str) -> None:
        self.restarts[m.spec.tier] += 1
        if sum(self.restarts.values()) > self.retry_budget:
            raise RetryBudgetExhausted(
                f"{m.spec.name} {why}; {sum(self.restarts.values())} restarts exceed "
                f"limits.retryBudget ({self.retry_budget}); see {m.spec.log}"
            )
        delay = min(BACKOFF_MAX_S, BACKOFF_START_S * 2**m.failures)
        m.failures += 1
        m.restart_at = time.monotonic() + delay
        self.log(f"{m.spec.name} {why}; restarting in {delay:.0f} s (see {m.spec.log})")

    def running(self, name: str) -> bool:
        m = self.managed[name]
        return m.proc is not None and m.proc.poll() is None

    def ready(self, name: str) -> bool:
        """Running and, if it was restarted, past its readiness probe: what a pod's Ready condition says."""
        return self.running(name) and self.managed[name].ready_by is None

    def signal(self, name: str, sig: int = signal.SIGTERM) -> None:
        m = self.managed[name]
        if m.proc is not None and m.proc.poll() is None:
            os.killpg(m.proc.pid, sig)

    def stop(self, name: str) -> None:
        """Ask a process to stop (SIGTERM: the learner writes a final checkpoint); its exit, with whatever code,
        is the end it was asked for, never a crash to restart."""
        self.managed[name].stopping = True
        self.signal(name, signal.SIGTERM)

    def preempt(self, name: str) -> None:
        """A preemption notice for one process (a spot reclaim, a node drain): SIGTERM, so it stops taking
        work and the learner moves its episodes elsewhere; killed if still running after the notice; then
        replaced at once. Preemptions are counted apart and never spend the retry budget."""
        m = self.managed[name]
        if m.proc is not None and m.proc.poll() is None:
            m.preempted_at = time.monotonic()
            self._event(name, "preempted")
            self.signal(name, signal.SIGTERM)

    def kill(self, name: str) -> None:
        """SIGKILL a process (fault injection and tests); the next poll restarts it."""
        self.signal(name, signal.SIGKILL)

    def wait(self, name: str, timeout: float) -> int | None:
        m = self.managed[name]
        if m.proc is None:
            return None
        try:
            return m.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop_all(self, timeout: float = 30.0) -> None:
        """SIGTERM every process group, then SIGKILL what is left after `timeout`."""
        for name in reversed(list(self.managed)):
            self.signal(name)
            self.managed[name].restart_at = None
        deadline = time.monotonic() + timeout
        for m in self.managed.values():
            if m.proc is None:
                continue
            try:
                m.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(m.proc.pid, signal.SIGKILL)
                m.proc.wait()
            m.proc = None

    def _wait_ready(self, m: Managed, timeout: float) -> None:
        wait_until_ready(m.spec.ready_url, m.proc, m.spec.log, timeout, name=m.spec.name)

    def _event(self, name: str, what: str, **details) -> None:
        self.events.append({"time": time.time(), "process": name, "event": what, **details})
