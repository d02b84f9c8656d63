"""Prometheus metrics of a sandbox server (names and units in docs/metrics.md)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

from kuberl.api.tampering import TamperingReason
from kuberl_sandbox.execution import CommandResult

disable_created_metrics()  # the *_created series double the scrape for no dashboard use

COMMAND_KINDS = ("exec", "tests", "hidden_tests")
ERROR_STATUSES = ("400", "401", "404", "409", "413", "422", "503")  # what the API answers (docs/sandbox.md)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class SandboxMetrics:
    """One registry per server, so several servers (tests) can live in one process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.sessions_open = Gauge("kuberl_sandbox_sessions_open", "Sessions currently open.", registry=r)
        self.sessions_created = Counter("kuberl_sandbox_sessions_created_total", "Sessions created.", registry=r)
        self.sessions_expired = Counter(
            "kuberl_sandbox_sessions_expired_total", "Sessions closed for being idle too long.", registry=r
        )
        self.commands = Counter("kuberl_sandbox_commands_total", "Commands run.", ["kind"], registry=r)
        self.command_seconds = Histogram(
            "kuberl_sandbox_command_duration_seconds",
            "Wall-clock seconds of one command.",
            ["kind"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.timeouts = Counter(
            "kuberl_sandbox_command_timeouts_total", "Commands killed at their wall-clock limit.", ["kind"], registry=r
        )
        self.truncated = Counter(
            "kuberl_sandbox_command_output_truncated_total", "Commands killed for exceeding the output cap.", registry=r
        )
        self.cached_test_runs = Counter(
            "kuberl_sandbox_test_runs_cached_total",
            "Test runs answered with the outcome of an earlier run on byte-identical files (no process started).",
            ["kind"],
            registry=r,
        )
        self.errors = Counter("kuberl_sandbox_errors_total", "Requests answered with an error.", ["reason"], registry=r)
        self.tampering = Counter(
            "kuberl_sandbox_tampering_total",
            "Test reports judged forged or broken (scored 0), by reason.",
            ["reason"],
            registry=r,
        )
        # every series exists from the start at 0, so rates and alerts see 0 rather than nothing
        for kind in COMMAND_KINDS:
            self.commands.labels(kind)
            self.command_seconds.labels(kind)
            self.timeouts.labels(kind)
        for kind in COMMAND_KINDS[1:]:
            self.cached_test_runs.labels(kind)
        for status in ERROR_STATUSES:
            self.errors.labels(status)
        for reason in TamperingReason:
            self.tampering.labels(reason.value)

    def observe_command(self, kind: str, result: CommandResult) -> None:
        self.commands.labels(kind).inc()
        self.command_seconds.labels(kind).observe(result.duration_s)
        if result.timed_out:
            self.timeouts.labels(kind).inc()
        if result.truncated:
            self.truncated.inc()

    def observe_cached_test_run(self, kind: str) -> None:
        """A test run of `kind` (tests or hidden_tests) served from the outcome cache."""
        self.cached_test_runs.labels(kind).inc()

    def observe_tampering(self, reason: str) -> None:
        """A test report the sandbox judged forged or broken; `reason` is a TamperingReason value."""
        self.tampering.labels(TamperingReason(reason).value).inc()
