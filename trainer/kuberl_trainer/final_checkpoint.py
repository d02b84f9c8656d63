"""The learner pod's preStop hook: ask the learner for its final checkpoint and wait until it is written.

Runs inside the learner container (`python -m kuberl_trainer.final_checkpoint`). torchrun is PID 1 and
its workers (the `kuberl learner` processes) are its children. The workers get SIGTERM directly, which
the learner turns into a clean stop with a final checkpoint; the hook then waits for them to exit. The
kubelet bounds the wait with the pod's terminationGracePeriodSeconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path


def children_of(parent: int, proc: Path = Path("/proc")) -> list[int]:
    """Pids whose parent is `parent`, read from /proc (no ps in slim images)."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # exited while we looked
            continue
        # the command name in parentheses may hold spaces: the parent pid is the second field after it
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent:
            pids.append(int(entry.name))
    return pids


def stop_and_wait(pids: list[int], poll_s: float = 1.0) -> None:
    """SIGTERM each pid, then wait until none is alive."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited on its own meanwhile
            os.kill(pid, signal.SIGTERM)
    while pids:
        time.sleep(poll_s)
        pids = [pid for pid in pids if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie has finished; torchrun reaps it


def main() -> None:
    stop_and_wait([pid for pid in children_of(1) if pid != os.getpid()])


if __name__ == "__main__":
    main()
