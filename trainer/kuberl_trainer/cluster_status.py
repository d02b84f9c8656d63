"""The learner's report into its RLJob's status, when it runs in a cluster (the operator's side of the contract
is in docs/operator.md).

The learner owns a few status fields (step, policy version, last checkpoint, reward, tokens/s, staleness) and
says that it stopped itself with a `LearnerStopped` condition whose reason is a `Reason`; the operator owns
the phase and its own conditions and acts on the report. Both merge-patch `rljobs/<name>/status`, each only
its own fields, so neither overwrites the other. Locally (`kuberl run`) there is no RLJob object: the same
fragment goes to status.json only.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import UTC, datetime
from typing import Any

from kuberl.api import env_vars
from kuberl.api.status import LEARNER_FIELDS, LEARNER_STOPPED, Condition, RLJobStatus, SandboxPoolStatus

log = logging.getLogger(__name__)

JOB_NAME_ENV, NAMESPACE_ENV = env_vars.JOB_NAME, env_vars.NAMESPACE
MIN_INTERVAL_S = 5.0  # a step every second must not become a status write every second
STOP_REPORT_ATTEMPTS = 3  # the stop report is the last write: no later one carries its final checkpoint
STOP_REPORT_RETRY_S = 2.0  # within the learner's termination grace, which is minutes


def learner_fields(status: RLJobStatus) -> dict[str, Any]:
    """The fields of `status` the learner owns, as the API stores them (camelCase, JSON values)."""
    dumped = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return {k: dumped[k] for k in LEARNER_FIELDS if k in dumped}


def with_stop_condition(conditions: list[dict[str, Any]], status: RLJobStatus, now: datetime) -> list[dict[str, Any]]:
    """`conditions` (as stored) with LearnerStopped set from the learner's final phase and reason; the other
    writers' conditions are kept as they are (a merge patch replaces the whole list)."""
    condition = Condition(
        type=LEARNER_STOPPED,
        status="True",
        reason=str(status.reason or status.phase),
        message=status.message or "",
        last_transition_time=now,
    )
    kept = [c for c in conditions if c.get("type") != LEARNER_STOPPED]
    return [*kept, condition.model_dump(mode="json", by_alias=True, exclude_none=True)]


class ClusterStatus:
    """Merge-patches the learner's fields into its RLJob's status, at most every MIN_INTERVAL_S unless
    forced (a checkpoint or the stop). A failed write is logged, never raised: training goes on, and the next
    write carries the newest values; the stop report, which has no next write, is tried again."""

    def __init__(self, kube, namespace: str, name: str) -> None:
        self.kube = kube
        self.path = f"/apis/kuberl.io/v1alpha1/namespaces/{namespace}/rljobs/{name}/status"
        self.last_write = 0.0
        self.last_sent: dict[str, Any] = {}

    @classmethod
    def from_environment(cls) -> ClusterStatus | None:
        """Set up when the pod says which job it belongs to (the operator sets both variables); else None."""
        name, namespace = os.environ.get(JOB_NAME_ENV), os.environ.get(NAMESPACE_ENV)
        if not name or not namespace:
            return None
        from kuberl.kube import Kube

        return cls(Kube.from_environment(), namespace, name)

    def report(self, status: RLJobStatus, force: bool = False) -> None:
        fields = learner_fields(status)
        if fields == self.last_sent or (not force and time.monotonic() - self.last_write < MIN_INTERVAL_S):
            return
        self._patch({"status": fields})
        self.last_sent = fields

    def stopped(self, status: RLJobStatus) -> None:
        """The final report: the fields and the LearnerStopped condition with the stop's reason."""
        try:
            current = (self.kube.get(self.path.removesuffix("/status")) or {}).get("status") or {}
        except Exception as err:  # reporting must never stop the learner from exiting cleanly
            log.warning("could not read the RLJob status (%s); the stop report keeps only LearnerStopped", err)
            current = {}
        conditions = with_stop_condition(current.get("conditions") or [], status, datetime.now(UTC))
        for attempt in range(1, STOP_REPORT_ATTEMPTS + 1):
            if self._patch({"status": {**learner_fields(status), "conditions": conditions}}):
                return
            if attempt < STOP_REPORT_ATTEMPTS:
                time.sleep(STOP_REPORT_RETRY_S)
        log.warning("the stop report was not written after %d attempts", STOP_REPORT_ATTEMPTS)

    def sandbox_pools(self) -> list[SandboxPoolStatus] | None:
        """The operator's view of the job's per-image sandbox pools (status.sandboxPools); None when the RLJob
        cannot be read (the caller keeps what it knew). An entry this learner cannot read is skipped."""
        try:
            status = (self.kube.get(self.path.removesuffix("/status")) or {}).get("status") or {}
        except Exception as err:  # like a failed write: training goes on
            log.warning("could not read the RLJob's sandbox pools (%s)", err)
            return None
        pools = []
        for entry in status.get("sandboxPools") or []:
            try:
                pools.append(SandboxPoolStatus.model_validate(entry))
            except ValueError as err:
                log.warning("a sandbox pool status this learner cannot read: %s", err)
        return pools

    def _patch(self, body: dict[str, Any]) -> bool:
        """Whether the write went through."""
        self.last_write = time.monotonic()
        try:
            self.kube.patch(self.path, body)
        except Exception as err:  # see the class docstring
            log.warning("could not write the RLJob status (%s)", err)
            return False
        return True
