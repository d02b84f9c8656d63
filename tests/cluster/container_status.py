"""One container's life as the test node agent (tests/cluster/kubelet.py) reports it, kubelet-style: waiting,
running or terminated, the last termination, restarts with their back-off (CrashLoopBackOff), failed image
pulls (ErrImagePull, then ImagePullBackOff until the next try) and the termination message a container
leaves at its terminationMessagePath (or, with FallbackToLogsOnError, its log's tail). The agent runs the
processes; this module only keeps their state and writes the status entries.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

DEFAULT_MESSAGE_PATH = "/dev/termination-log"
MESSAGE_LIMIT = 4096  # bytes of a termination message the kubelet keeps
LOG_FALLBACK_LINES, LOG_FALLBACK_BYTES = 80, 2048  # FallbackToLogsOnError: the log's tail, as the kubelet cuts it
START_MARKER = "--- "  # the node agent's line in a container's log at each of its starts


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def back_off(attempts: int) -> float:
    """Seconds before the next start or pull: from 1 s, doubling, capped at 10 s (a kubelet's: 10 s to 5 min)."""
    return min(10.0, 2.0 ** min(attempts, 4) * 0.5 + 0.5)


def log_tail(logfile: Path) -> str:
    """The last lines the container's latest start wrote to its log (at most 80 lines, 2 KiB)."""
    try:
        with logfile.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(lines) if line.startswith(START_MARKER) and " start " in line]
    lines = lines[starts[-1] + 1 :] if starts else lines
    text = "\n".join(lines[-LOG_FALLBACK_LINES:])
    return text.encode()[-LOG_FALLBACK_BYTES:].decode(errors="ignore")


def termination_message(spec: dict[str, Any], message_file: Path | None, logfile: Path, exit_code: int) -> str:
    """What the container left at its terminationMessagePath (the first 4 KiB); with the policy
    FallbackToLogsOnError and nothing there, the tail of its log when it failed."""
    message = ""
    if message_file is not None:
        try:
            with message_file.open("rb") as f:
                message = f.read(MESSAGE_LIMIT).decode(errors="replace")
        except OSError:
            pass
    if not message and exit_code != 0 and spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
        message = log_tail(logfile)
    return message


@dataclass
class ProbeState:
    spec: dict[str, Any] | None
    period: float
    next_at: float = 0.0
    failures: int = 0
    successes: int = 0
    passed: bool = False


@dataclass
class Container:
    spec: dict[str, Any]
    init: bool = False  # an init container: runs to completion before the pod's containers start
    process: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    restarts: int = 0
    restart_at: float | None = 0.0  # when to (re)start; None: not again
    pull_failures: int = 0
    last_terminated: dict[str, Any] | None = None
    waiting: tuple[str, str] | None = ("ContainerCreating", "")
    terminated: dict[str, Any] | None = None
    probes: dict[str, ProbeState] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    message_file: Path | None = None  # the node's file at its terminationMessagePath

    @property
    def name(self) -> str:
        return self.spec["name"]

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def pid1(self) -> int | None:
        """The container's own process (PID 1 of its namespace): the one child of `unshare --fork`."""
        if not self.running():
            return None
        assert self.process is not None
        try:
            children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def started(self) -> bool:
        """Its startup probe (if any) has passed."""
        startup = self.probes.get("startup")
        return not (startup and startup.spec) or startup.passed

    def ready(self) -> bool:
        if not self.running():
            return False
        startup, readiness = self.probes.get("startup"), self.probes.get("readiness")
        if startup and startup.spec and not startup.passed:
            return False
        return not (readiness and readiness.spec) or readiness.passed

    def completed(self) -> bool:
        """It ran to its end with exit code 0 and will not start again (an init container's success)."""
        return self.terminated is not None and self.terminated["exitCode"] == 0 and self.restart_at is None

    def failed(self) -> bool:
        """It ended with an error and will not start again (restartPolicy Never)."""
        return self.terminated is not None and self.terminated["exitCode"] != 0 and self.restart_at is None

    def exited(self, code: int, message: str, again: bool, pod: str, monotonic: float) -> None:
        """Its process ended with `code`: terminated, or (`again`) in CrashLoopBackOff until its next start."""
        self.terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": self.started_at,
            "finishedAt": now(),
        }
        if message:
            self.terminated["message"] = message
        self.process = None
        if not again:
            self.restart_at = None
            return
        delay = back_off(self.restarts)
        self.restart_at = monotonic + delay
        self.last_terminated, self.terminated = self.terminated, None
        self.waiting = ("CrashLoopBackOff", f"back-off {delay:.0f}s restarting failed container={self.name} pod={pod}")

    def pull_failed(self, detail: str, monotonic: float) -> None:
        """Its image could not be had: ErrImagePull now, ImagePullBackOff (pull_backing_off) until the next try."""
        self.pull_failures += 1
        self.restart_at = monotonic + back_off(self.pull_failures - 1)
        self.waiting = ("ErrImagePull", f'failed to pull and unpack image "{self.spec["image"]}": {detail}')

    def pull_backing_off(self) -> None:
        """After an ErrImagePull has been reported: the back-off before the next pull, as the kubelet says it."""
        if self.waiting and self.waiting[0] == "ErrImagePull":
            image = self.spec["image"]
            self.waiting = ("ImagePullBackOff", f'Back-off pulling image "{image}": ErrImagePull: {self.waiting[1]}')

    def status_entry(self, waiting_for_init: bool = False) -> dict[str, Any]:
        """Its entry in containerStatuses (or initContainerStatuses)."""
        if self.running():
            state: dict[str, Any] = {"running": {"startedAt": self.started_at}}
        elif self.terminated is not None:
            state = {"terminated": self.terminated}
        else:
            reason, message = ("PodInitializing", "") if waiting_for_init else self.waiting or ("ContainerCreating", "")
            state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}
        entry = {
            "name": self.name,
            "image": self.spec["image"],
            "ready": self.completed() if self.init else self.ready(),
            "started": self.running() and (self.init or self.started()),
            "restartCount": self.restarts,
            "state": state,
        }
        if self.last_terminated:
            entry["lastState"] = {"terminated": self.last_terminated}
        return entry
