"""The learner's report into its RLJob status: only its own fields, and a stop condition that keeps the
operator's conditions (a merge patch replaces a whole list)."""

from __future__ import annotations

from datetime import UTC, datetime

from kuberl.api.status import LEARNER_STOPPED, CheckpointRef, Phase, Reason, RLJobStatus
from kuberl_trainer import cluster_status
from kuberl_trainer.cluster_status import ClusterStatus, learner_fields, with_stop_condition

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


class RecordingKube:
    def __init__(self, stored: dict | None = None) -> None:
        self.stored, self.patches = stored or {}, []

    def get(self, path: str) -> dict:
        return self.stored

    def patch(self, path: str, body: dict) -> dict:
        self.patches.append((path, body))
        return {}


def test_the_learner_writes_only_the_fields_it_owns():
    status = RLJobStatus(
        phase=Phase.RUNNING,
        reason=Reason.TRAINING,
        step=7,
        policy_version=8,
        reward_mean=0.5,
        last_checkpoint=CheckpointRef(step=6, uri="s3://b/j/step-6"),
        running_seconds=9.0,
    )
    assert learner_fields(status) == {
        "step": 7,
        "policyVersion": 8,
        "rewardMean": 0.5,
        "lastCheckpoint": {"step": 6, "uri": "s3://b/j/step-6"},
    }


def test_the_stop_condition_replaces_an_old_one_and_keeps_the_operators():
    stored = [
        {"type": "Ready", "status": "True", "reason": "Training"},
        {"type": LEARNER_STOPPED, "status": "True", "reason": "MaxStepsReached"},
    ]
    final = RLJobStatus(phase=Phase.FAILED, reason=Reason.NON_FINITE_LOSS, message="3 in a row")
    conditions = with_stop_condition(stored, final, NOW)
    assert [c["type"] for c in conditions] == ["Ready", LEARNER_STOPPED]
    assert conditions[1] == {
        "type": LEARNER_STOPPED,
        "status": "True",
        "reason": "NonFiniteLoss",
        "message": "3 in a row",
        "lastTransitionTime": "2026-11-30T12:00:00Z",
    }


def test_reports_are_rate_limited_unless_forced_and_never_repeat_themselves():
    kube = RecordingKube()
    reporter = ClusterStatus(kube, "team", "job")
    reporter.report(RLJobStatus(step=1), force=True)
    reporter.report(RLJobStatus(step=2))  # within MIN_INTERVAL_S of the last write
    reporter.report(RLJobStatus(step=1), force=True)  # nothing new
    reporter.report(RLJobStatus(step=3), force=True)  # a checkpoint: forced
    assert [body["status"]["step"] for _, body in kube.patches] == [1, 3]
    assert kube.patches[0][0] == "/apis/kuberl.io/v1alpha1/namespaces/team/rljobs/job/status"


def test_the_stop_report_merges_into_the_stored_conditions_and_a_failing_api_is_only_logged(monkeypatch):
    monkeypatch.setattr(cluster_status, "STOP_REPORT_RETRY_S", 0.0)
    kube = RecordingKube({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Stopping"}]}})
    ClusterStatus(kube, "team", "job").stopped(RLJobStatus(phase=Phase.SUCCEEDED, reason=Reason.COMPLETED, step=9))
    body = kube.patches[0][1]["status"]
    assert body["step"] == 9 and [c["type"] for c in body["conditions"]] == ["Ready", LEARNER_STOPPED]

    class Down(RecordingKube):
        def patch(self, path: str, body: dict) -> dict:
            raise ConnectionError("API server unreachable")

        get = patch

    ClusterStatus(Down(), "team", "job").stopped(RLJobStatus(step=1))  # does not raise


def test_a_stop_report_that_times_out_is_tried_again(monkeypatch):
    monkeypatch.setattr(cluster_status, "STOP_REPORT_RETRY_S", 0.0)

    class SlowOnce(RecordingKube):
        timed_out = False

        def patch(self, path: str, body: dict) -> dict:
            if not self.timed_out:
                self.timed_out = True
                raise TimeoutError("read timed out")
            return super().patch(path, body)

    kube = SlowOnce()
    ClusterStatus(kube, "team", "job").stopped(RLJobStatus(phase=Phase.STOPPED, step=6))
    assert [body["status"]["step"] for _, body in kube.patches] == [6]
