"""Test outcomes by what was tested: a task's tests on the same workspace content give the same outcome.

Every episode of a GRPO group starts from the same files and usually runs the task's tests on them first; the
episodes that make the same edit then test the same files again, and submit them. Each test run is a process
tree (prlimit, unshare, mount, setpriv, python) of about 20 ms of CPU: on the demo's 2 cores the sandbox's
command processes took 32 of every 45 CPU-seconds, more than the vLLM engine and the learner together.

The key is the task (a digest of everything it holds: files, tests, checks, FAIL_TO_PASS ids), whether the
hidden tests ran, and the workspace's checksum (every entry's path, kind, permission bits and content, as
`workspace.checksum` computes it). So a cached outcome is only ever reused for byte-identical files tested by
the same tests. What is not in the key: the clock, randomness and files outside the workspace. Code whose
outcome depends on them is scored once per content (identical submissions score identically, as a test-result
cache such as Bazel's would); a run that timed out is never kept, since load alone can cause one.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

from kuberl.api.environment import Task
from kuberl_sandbox.testrun import TestOutcome


def task_digest(task: Task) -> str:
    """A digest of everything that decides how the task's tests run and are judged."""
    return hashlib.sha256(task.model_dump_json().encode()).hexdigest()


class OutcomeCache:
    """The outcomes of one server's test runs, keyed by (task digest, hidden, workspace checksum)."""

    def __init__(self, entries: int) -> None:
        """`entries`: outcomes kept, the least recently used dropped first; 0 keeps none."""
        self.entries = entries
        self._outcomes: OrderedDict[tuple[str, bool, str], TestOutcome] = OrderedDict()

    def get(self, task: str, hidden: bool, content: str) -> TestOutcome | None:
        outcome = self._outcomes.get((task, hidden, content))
        if outcome is not None:
            self._outcomes.move_to_end((task, hidden, content))
        return outcome

    def put(self, task: str, hidden: bool, content: str, outcome: TestOutcome) -> None:
        if self.entries <= 0 or outcome.timed_out:
            return
        self._outcomes[(task, hidden, content)] = outcome
        self._outcomes.move_to_end((task, hidden, content))
        while len(self._outcomes) > self.entries:
            self._outcomes.popitem(last=False)

    def __len__(self) -> int:
        return len(self._outcomes)
