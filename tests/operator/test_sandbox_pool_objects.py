"""The pure parts of the sandbox pools per image: their objects (sandbox_pools), what their pods say about their
image (pool_health), the rollout tier's demand per image (demand) and the pools' status entries."""

from __future__ import annotations

import kubernetes_validate
import pytest

from kuberl.api.env_vars import SANDBOX_POOL_URL
from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import pool_key, pool_service_name
from kuberl.portable_server import PORTABLE_MOUNT, install_argv, server_argv, server_env
from kuberl_operator.demand import StartLatency, parse_rollout_metrics
from kuberl_operator.images import JobImages
from kuberl_operator.pool_health import ImageFailure, PoolHealth, pod_failure, pods_by_pool, pool_health
from kuberl_operator.pool_reconcile import PoolsMemory, pool_limits, pool_statuses, record_failures
from kuberl_operator.rollout import build_rollout_statefulset
from kuberl_operator.sandbox import POOL_LABEL, build_sandbox_deployment, build_sandbox_service
from kuberl_operator.sandbox_pools import IMAGE_ANNOTATION, pool_objects
from kuberl_operator.security import SandboxPodSecurity

NEWEST = kubernetes_validate.utils.latest_version()
IMAGE = "docker.io/swebench/sweb.eval.x86_64.django_1776_django-11099:latest"
IMAGES = JobImages(registry="registry.example.com/kuberl", tag="1.0.0")
SECURITY = SandboxPodSecurity()


def job(**sandbox) -> RLJob:
    return RLJob.from_manifest(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "swe", "namespace": "rl"},
            "spec": {"model": {"uri": "s3://models/tiny"}, "sandbox": sandbox},
        }
    )


def objects(j: RLJob, replicas: int = 2, engine: str = "kuberl") -> dict[str, dict]:
    built = pool_objects(j, {IMAGE: replicas}, "rl", None, "swe-sandbox-token", SECURITY, IMAGES, engine)
    return {o["kind"]: o for o in built}


def test_an_image_pool_is_a_service_and_a_deployment_named_for_the_image():
    built = objects(job())
    name = pool_service_name("swe", IMAGE)
    assert [o["metadata"]["name"] for o in built.values()] == [name, name]
    deployment, service = built["Deployment"], built["Service"]
    assert deployment["spec"]["replicas"] == 2
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector[POOL_LABEL] == pool_key(IMAGE) and selector["kuberl.io/tier"] == "sandbox"
    assert service["spec"]["selector"] == selector
    assert deployment["metadata"]["annotations"][IMAGE_ANNOTATION] == IMAGE
    for obj in built.values():
        kubernetes_validate.validate(obj, NEWEST, strict=True)


def test_the_task_image_runs_the_bundled_server_the_sandbox_image_installs():
    pod = objects(job())["Deployment"]["spec"]["template"]["spec"]
    (installer,) = pod["initContainers"]
    (server,) = pod["containers"]
    assert installer["image"] == "registry.example.com/kuberl/sandbox:1.0.0"
    assert installer["command"] == install_argv()
    assert server["image"] == IMAGE
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts[PORTABLE_MOUNT].get("readOnly") is True
    assert {m["mountPath"]: m for m in installer["volumeMounts"]}[PORTABLE_MOUNT].get("readOnly") is None
    names = [e["name"] for e in server["env"]]
    assert len(names) == len(set(names))  # an env list is keyed by name (server-side apply refuses duplicates)
    env = {e["name"]: e.get("value") for e in server["env"]}
    assert all(env[k] == v for k, v in server_env().items())
    assert installer["securityContext"]["runAsNonRoot"] is True


def test_the_commands_path_in_task_images_is_the_images_own_unless_the_job_gives_one():
    conda = "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:/usr/bin:/bin"

    def server_path(j: RLJob) -> str | None:
        (server,) = objects(j)["Deployment"]["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in server["env"]}.get("PATH")

    assert server_path(job()) is None
    assert server_path(job(pools={"imagePath": conda})) == conda


def test_an_image_pool_pod_has_the_default_pools_hardening_and_placement():
    j = job(runtimeClassName="gvisor")
    default = build_sandbox_deployment(j, "rl", None, "swe-sandbox-token", SECURITY, IMAGES)["spec"]["template"]["spec"]
    pool = objects(j)["Deployment"]["spec"]["template"]["spec"]
    same = {k: v for k, v in default.items() if k not in ("containers", "volumes")}
    assert {k: pool[k] for k in same} == same
    assert pool["containers"][0]["securityContext"] == default["containers"][0]["securityContext"]
    assert pool["containers"][0]["readinessProbe"] == default["containers"][0]["readinessProbe"]
    assert pool["containers"][0]["resources"] == default["containers"][0]["resources"]
    # the same `kuberl sandbox` options, from the bundle: ["python", "-m", "kuberl_app.cli", "sandbox", *options]
    assert pool["containers"][0]["command"] == server_argv(default["containers"][0]["command"][4:])


def test_the_default_pools_service_selects_its_own_pods_and_its_deployment_selector_is_unchanged():
    j = job()
    deployment = build_sandbox_deployment(j, "rl", None, "swe-sandbox-token", SECURITY, IMAGES)
    assert POOL_LABEL not in deployment["spec"]["selector"]["matchLabels"]  # immutable: never grows
    assert deployment["spec"]["template"]["metadata"]["labels"][POOL_LABEL] == "default"
    assert build_sandbox_service(j, "rl", None)["spec"]["selector"][POOL_LABEL] == "default"


def test_the_agent_sandbox_engine_makes_a_template_and_a_warm_pool_of_the_same_pod():
    built = objects(job(), replicas=3, engine="agent-sandbox")
    assert set(built) == {"Service", "SandboxTemplate", "SandboxWarmPool"}
    name = pool_service_name("swe", IMAGE)
    assert built["SandboxWarmPool"]["spec"] == {"replicas": 3, "sandboxTemplateRef": {"name": name}}
    template = built["SandboxTemplate"]["spec"]
    assert template["networkPolicyManagement"] == "Unmanaged"  # the job's own sandbox NetworkPolicy applies
    kuberl = objects(job())["Deployment"]["spec"]["template"]
    assert template["podTemplate"] == kuberl
    assert built["SandboxWarmPool"]["apiVersion"] == "extensions.agents.x-k8s.io/v1beta1"


def test_a_suspended_job_renders_its_pools_at_zero():
    assert objects(job(), replicas=5)["Deployment"]["spec"]["replicas"] == 5
    suspended = job().model_copy(update={"spec": job().spec.model_copy(update={"suspend": True})})
    assert objects(suspended, replicas=5)["Deployment"]["spec"]["replicas"] == 0


def test_rollout_pods_know_where_the_pools_are():
    statefulset = build_rollout_statefulset(job(), "rl", None, "swe-sandbox-token", IMAGES)
    env = {e["name"]: e.get("value") for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env[SANDBOX_POOL_URL] == "http://{pool}.rl.svc:8700"


# ---------------------------------------------------------------------------------- pool health
def pod(name: str = "p-1", pool: str = "abc", ready: bool = False, **status) -> dict:
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    labels = {"kuberl.io/job": "swe", "kuberl.io/tier": "sandbox", POOL_LABEL: pool}
    return {"metadata": {"name": name, "labels": labels}, "status": {"conditions": conditions, **status}}


def waiting(reason: str, message: str = "", restarts: int = 0, key: str = "containerStatuses") -> dict:
    return {
        key: [{"name": "c", "restartCount": restarts, "state": {"waiting": {"reason": reason, "message": message}}}]
    }


@pytest.mark.parametrize(
    ("status", "failure"),
    [
        (waiting("ErrImagePull", "not found"), ImageFailure("ErrImagePull", "not found")),
        (waiting("ImagePullBackOff", "back-off"), ImageFailure("ImagePullBackOff", "back-off")),
        (waiting("InvalidImageName", "bad"), ImageFailure("InvalidImageName", "bad")),
        (waiting("ErrImagePull", "x", key="initContainerStatuses"), ImageFailure("ErrImagePull", "x")),
        (waiting("CrashLoopBackOff", "back-off 40s", restarts=3), ImageFailure("CrashLoopBackOff", "back-off 40s")),
        (waiting("CrashLoopBackOff", "back-off 10s", restarts=2), None),  # not yet the image's fault
        (waiting("ContainerCreating"), None),
        (
            {
                "containerStatuses": [
                    {"name": "c", "state": {"terminated": {"exitCode": 1, "message": "no /bin/sh in the image"}}}
                ]
            },
            ImageFailure("ServerCannotStart", "no /bin/sh in the image"),
        ),
        ({}, None),
    ],
    ids=["pull", "backoff", "invalid", "init-pull", "crashloop", "crash-twice", "creating", "server-said", "fine"],
)
def test_what_a_pool_pod_says_about_its_image(status, failure):
    assert pod_failure(pod(**status)) == failure


def test_a_pools_health_counts_ready_pods_and_ignores_terminating_ones():
    pods = [pod("a", ready=True), pod("b", ready=True), pod("c", **waiting("ImagePullBackOff", "m"))]
    gone = pod("d", ready=True)
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert pool_health([*pods, gone]) == PoolHealth(3, 2, ImageFailure("ImagePullBackOff", "m"))


def test_pods_are_grouped_by_pool_and_the_default_pool_and_other_tiers_are_left_out():
    default = pod("s", pool="default")
    rollout = {"metadata": {"name": "r", "labels": {"kuberl.io/tier": "rollout"}}, "status": {}}
    grouped = pods_by_pool([pod("a", pool="k1"), pod("b", pool="k2"), pod("c", pool="k1"), default, rollout])
    assert {k: [p["metadata"]["name"] for p in v] for k, v in grouped.items()} == {"k1": ["a", "c"], "k2": ["b"]}


# ---------------------------------------------------------------------------------- demand and status
METRICS = """# TYPE kuberl_rollout_active_sessions gauge
kuberl_rollout_active_sessions{image=""} 3
kuberl_rollout_active_sessions{image="img/a:1"} 4
# TYPE kuberl_rollout_queued_trajectories gauge
kuberl_rollout_queued_trajectories{image="img/a:1"} 2
# TYPE kuberl_rollout_upcoming_sessions gauge
kuberl_rollout_upcoming_sessions{image="img/b:1"} 5
# TYPE kuberl_rollout_sandbox_wait_seconds histogram
kuberl_rollout_sandbox_wait_seconds_bucket{image="img/a:1",le="+Inf"} 2
kuberl_rollout_sandbox_wait_seconds_sum{image="img/a:1"} 30
kuberl_rollout_sandbox_wait_seconds_count{image="img/a:1"} 2
"""


def test_the_rollout_metrics_are_read_per_image():
    parsed = parse_rollout_metrics(METRICS)
    assert parsed[""]["kuberl_rollout_active_sessions"] == 3
    assert parsed["img/a:1"]["kuberl_rollout_active_sessions"] == 4
    assert parsed["img/a:1"]["kuberl_rollout_queued_trajectories"] == 2
    assert parsed["img/b:1"]["kuberl_rollout_upcoming_sessions"] == 5
    assert parsed["img/a:1"]["kuberl_rollout_sandbox_wait_seconds_count"] == 2


def test_an_unlabelled_server_reports_the_default_pools_demand():
    parsed = parse_rollout_metrics("# TYPE kuberl_rollout_active_sessions gauge\nkuberl_rollout_active_sessions 7\n")
    assert set(parsed) == {""} and parsed[""]["kuberl_rollout_active_sessions"] == 7


def test_wait_means_are_taken_per_image_since_the_last_scrape():
    waits = StartLatency()
    assert waits.means_since_last({("p", "a"): ("a", 30.0, 2.0), ("p", "b"): ("b", 0.0, 0.0)}) == {
        "a": 15.0,
        None: 15.0,
    }
    assert waits.means_since_last({("p", "a"): ("a", 40.0, 3.0)}) == {"a": 10.0, None: 10.0}
    assert waits.means_since_last({("p", "a"): ("a", 5.0, 1.0)}) == {"a": 5.0, None: 5.0}  # the pod restarted


def test_unusable_images_are_kept_and_read_back_from_the_status():
    j = job()
    memory = PoolsMemory()
    health = {pool_key(IMAGE): PoolHealth(1, 0, ImageFailure("ErrImagePull", "denied"))}
    assert record_failures(memory, {IMAGE, "other:1"}, health, []) == {IMAGE: ImageFailure("ErrImagePull", "denied")}
    assert record_failures(memory, {IMAGE}, health, []) == {}  # once
    statuses = pool_statuses(j, {IMAGE, "other:1"}, {"other:1": 2}, health, memory)
    assert [(s.image, s.replicas, s.unusable, s.reason) for s in statuses] == sorted(
        [(IMAGE, 0, True, "ErrImagePull"), ("other:1", 2, False, None)], key=lambda t: pool_service_name("swe", t[0])
    )
    restarted = PoolsMemory()
    assert record_failures(restarted, {IMAGE}, {}, statuses) == {}  # not new: no second event or count
    assert restarted.unusable[IMAGE] == ImageFailure("ErrImagePull", "denied")


def test_the_pools_share_maxreplicas_with_the_default_pool():
    limits = pool_limits(job(maxReplicas=10, sessionsPerPod=4, pools={"idleTimeout": "2m", "maxWarmImages": 3}), 4)
    assert (limits.max_replicas, limits.sessions_per_pod, limits.idle_timeout_s, limits.max_warm_images) == (
        6,
        4,
        120.0,
        3,
    )
    assert pool_limits(job(maxReplicas=10), 12).max_replicas == 0
