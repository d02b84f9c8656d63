"""What the operator reads back from pods and the learner, and how it decides what to (re)apply."""

from __future__ import annotations

from kuberl.api.rljob import RLJob
from kuberl.api.spec import RLJobSpec
from kuberl.api.status import Reason
from kuberl_operator.apply import applied_spec, contains, unsafe_changes
from kuberl_operator.job_config import build_config_map
from kuberl_operator.lifecycle import LearnerStop, TierState
from kuberl_operator.observe import (
    NodeCapacity,
    desired_replicas,
    gpus_by_tier,
    gpus_in_use,
    learner_stop,
    node_capacity,
    pod_summary,
    sandbox_start_failure,
    tier_states,
)


def pod(name: str, tier: str, phase: str = "Running", ready: bool = True, gpus: int = 0, **extra) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}, *extra.pop("conditions", [])]
    return {
        "metadata": {"name": name, "labels": {"kuberl.io/tier": tier}, **extra},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": gpus}} if gpus else {}}]},
        "status": {"phase": phase, "conditions": conditions},
    }


DESIRED = {"learner": 2, "rollout": 2, "sandbox": 1}


def test_tier_states_count_ready_failed_and_disrupted_pods():
    pods = [
        pod("j-learner-0", "learner"),
        pod("j-learner-1", "learner", phase="Failed", ready=False),
        pod("j-rollout-0", "rollout", conditions=[{"type": "DisruptionTarget", "status": "True"}]),
        pod("j-rollout-1", "rollout", ready=False),
        pod("j-sandbox-x", "sandbox"),
        pod("j-rollout-2", "rollout", phase="Failed", deletionTimestamp="2026-01-01T00:00:00Z"),  # being replaced
        pod("other", "unrelated"),
    ]
    assert tier_states(pods, DESIRED) == {
        "learner": TierState(2, 1, ("j-learner-1",), ()),
        "rollout": TierState(2, 0, (), ("j-rollout-0",)),
        "sandbox": TierState(1, 1, (), ()),
    }


def test_gpus_in_use_counts_running_pods_only():
    pods = [pod("a", "learner", gpus=1), pod("b", "rollout", gpus=2), pod("c", "rollout", phase="Pending", gpus=4)]
    assert gpus_in_use(pods) == 3.0


def test_a_preemption_notice_on_the_node_disrupts_its_pods_before_it_goes():
    nodes = {"spot-1": NodeCapacity(spot=True, notice=True), "spot-2": NodeCapacity(spot=True, notice=False)}
    pods = [
        {**pod("j-rollout-0", "rollout"), "spec": {"nodeName": "spot-1", "containers": []}},
        {**pod("j-rollout-1", "rollout"), "spec": {"nodeName": "spot-2", "containers": []}},
        {**pod("j-learner-0", "learner"), "spec": {"nodeName": "unknown", "containers": []}},
    ]
    states = tier_states(pods, DESIRED, nodes)
    assert states["rollout"] == TierState(2, 1, (), ("j-rollout-0",))
    assert states["learner"] == TierState(2, 1, (), ())


def test_node_capacity_reads_the_clouds_spot_labels_and_notice_taints():
    gke_spot = {"metadata": {"labels": {"cloud.google.com/gke-spot": "true"}}}
    reclaimed = {
        **gke_spot,
        "spec": {"taints": [{"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}]},
    }
    karpenter = {"metadata": {"labels": {"karpenter.sh/capacity-type": "on-demand"}}}
    assert node_capacity(gke_spot) == NodeCapacity(spot=True, notice=False)
    assert node_capacity(reclaimed) == NodeCapacity(spot=True, notice=True)
    assert node_capacity(karpenter) == NodeCapacity(spot=False, notice=False)
    assert node_capacity({}) == NodeCapacity(spot=False, notice=False)


def test_gpus_split_by_tier_and_by_spot_nodes():
    nodes = {"spot": NodeCapacity(spot=True, notice=False), "od": NodeCapacity(spot=False, notice=False)}
    on = lambda p, node: {**p, "spec": {**p["spec"], "nodeName": node}}  # noqa: E731
    pending = pod("d", "rollout", phase="Pending", gpus=2)
    pods = [
        on(pod("a", "learner", gpus=8), "od"),
        on(pod("b", "rollout", gpus=2), "spot"),
        on(pod("c", "rollout", gpus=2), "od"),
        on(pending, "spot"),
    ]
    total, spot = gpus_by_tier(pods, nodes)
    assert total == {"learner": 8.0, "rollout": 4.0, "sandbox": 0.0}
    assert spot == {"learner": 0.0, "rollout": 2.0, "sandbox": 0.0}


def test_pod_summary_keeps_what_the_observation_reads():
    full = {**pod("j-rollout-0", "rollout", gpus=1), "apiVersion": "v1", "kind": "Pod"}
    full["spec"].update(nodeName="n1", volumes=[{"name": "big"}])
    full["status"].update(podIP="10.0.0.7", containerStatuses=[{"name": "rollout"}])
    summary = pod_summary(full)
    assert summary["spec"]["nodeName"] == "n1" and summary["status"]["podIP"] == "10.0.0.7"
    assert "volumes" not in summary["spec"] and "containerStatuses" not in summary["status"]
    assert tier_states([summary], DESIRED) == tier_states([full], DESIRED)
    assert gpus_by_tier([summary]) == gpus_by_tier([full])


def test_a_sandbox_that_cannot_isolate_sessions_is_named_in_the_observation():
    line = "sandbox: cannot isolate sessions: unshare failed: No space left on device. Sessions need ..."
    crashed = pod("j-sandbox-abc", "sandbox")
    crashed["status"]["containerStatuses"] = [
        {
            "name": "sandbox",
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "message": line + "\n"}},
        }
    ]
    healthy = pod("j-rollout-0", "rollout")
    healthy["status"]["containerStatuses"] = [{"name": "rollout", "lastState": {"terminated": {"message": "x"}}}]
    assert sandbox_start_failure([healthy, crashed]) == line
    assert sandbox_start_failure([pod_summary(healthy), pod_summary(crashed)]) == line  # the pod index keeps it
    assert sandbox_start_failure([healthy, pod("j-sandbox-def", "sandbox")]) is None


def test_desired_replicas_follow_the_spec_or_zero():
    job = RLJob.model_validate({"metadata": {"name": "j"}, "spec": {"rollout": {"replicas": 3}}})
    assert desired_replicas(job, scaled_down=False) == {"learner": 1, "rollout": 3, "sandbox": 1}
    assert desired_replicas(job, scaled_down=True) == {"learner": 0, "rollout": 0, "sandbox": 0}


def test_learner_stop_comes_from_its_condition():
    condition = {"type": "LearnerStopped", "status": "True", "reason": "NonFiniteLoss", "message": "3 in a row"}
    assert learner_stop({"conditions": [condition]}) == LearnerStop(Reason.NON_FINITE_LOSS, "3 in a row")
    assert learner_stop({"conditions": [{**condition, "reason": "Whatever"}]}) is None
    assert learner_stop({"conditions": [{**condition, "status": "False"}]}) is None
    assert learner_stop({}) is None


def test_contains_ignores_server_fields_but_not_changed_ones():
    desired = {"spec": {"replicas": 2, "ports": [{"port": 80}]}, "metadata": {"name": "a"}}
    existing = {
        "spec": {"replicas": 2, "ports": [{"port": 80, "protocol": "TCP"}]},
        "metadata": {"name": "a", "uid": "u", "resourceVersion": "7"},
    }
    assert contains(existing, desired)
    assert not contains(existing, {**desired, "spec": {"replicas": 0, "ports": [{"port": 80}]}})
    assert not contains(existing, {**desired, "spec": {"replicas": 2, "ports": [{"port": 80}, {"port": 81}]}})


def test_model_and_algorithm_changes_are_unsafe_replicas_and_limits_are_not():
    base = RLJobSpec()
    safe = RLJobSpec.model_validate({"rollout": {"replicas": 4}, "limits": {"maxWallClock": "1h"}})
    unsafe = RLJobSpec.model_validate({"model": {"uri": "s3://models/other"}, "algorithm": {"groupSize": 4}})
    assert unsafe_changes(base, safe) == []
    assert unsafe_changes(base, unsafe) == ["spec.model", "spec.algorithm"]


def test_applied_spec_reads_back_the_config_map():
    job = RLJob.model_validate({"metadata": {"name": "j"}, "spec": {"rollout": {"replicas": 3}}})
    assert applied_spec(build_config_map(job, "ns", None)) == job.spec
    assert applied_spec(None) is None


def test_a_queued_job_without_kueue_fails_its_apply_with_what_to_do():
    """The API server refuses the Workload (no Kueue CRD: 404; no RBAC: 403): the error names the field."""
    from kubernetes.client.rest import ApiException

    from kuberl.kube import Kube
    from kuberl_operator.apply import apply_children

    class NoKueue(Kube):
        def __init__(self) -> None:
            self.created: list[str] = []

        def create(self, obj, exist_ok=False):
            if obj["kind"] == "Workload":
                raise ApiException(status=404, reason="Not Found")
            self.created.append(obj["kind"])
            return obj

    job = RLJob.model_validate({"metadata": {"name": "j"}, "spec": {"scheduling": {"queueName": "team-a"}}})
    kube = NoKueue()
    try:
        apply_children(kube, job, "default", "uid-1", scaled_down=True, new=True)
    except RuntimeError as err:
        assert "spec.scheduling.queueName" in str(err) and "kueue.enabled" in str(err)
    else:
        raise AssertionError("the apply went on without the Workload")
    assert "StatefulSet" not in kube.created  # nothing that runs pods was created before admission was possible
