"""Job images and pull secrets: what a tier names wins; the operator's defaults (the chart's jobDefaults) fill
the rest, pull secrets merged without duplicates, and `kuberl render` shows the result as valid Kubernetes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import kubernetes_validate
import pytest
import yaml
from conftest import BIN, with_spec
from helpers.emulator import Api, emulated_api_server, write_kubeconfig
from kubernetes import config as kube_config

from kuberl import __version__
from kuberl.api import env_vars
from kuberl.api.rljob import RLJob
from kuberl.kube import Kube
from kuberl_operator.apply import apply_children
from kuberl_operator.config import OperatorConfig
from kuberl_operator.desired import desired_objects
from kuberl_operator.images import JobImages, release_tag

TIERS = {"learner": "StatefulSet", "rollout": "StatefulSet", "sandbox": "Deployment"}
NEWEST = kubernetes_validate.utils.latest_version()
TEAM = JobImages(registry="registry.example.com/team", tag="1.2.3", pull_secrets=("regcred", "mirror-pull"))


def job(**tiers: dict[str, Any]) -> RLJob:
    return RLJob.from_manifest(with_spec(**tiers))


def pod_specs(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """tier -> pod spec of its workload."""
    return {
        o["metadata"]["labels"]["kuberl.io/tier"]: o["spec"]["template"]["spec"]
        for o in objects
        if o["kind"] in ("StatefulSet", "Deployment")
    }


def secrets_of(pod: dict[str, Any]) -> list[str]:
    return [s["name"] for s in pod.get("imagePullSecrets", [])]


# ------------------------------------------------------------------------------ images
def test_out_of_the_box_the_images_are_kuberls_own_release():
    pods = pod_specs(desired_objects(job(), "ns", owner=None, images=JobImages()))
    version = release_tag(__version__)
    assert {t: p["containers"][0]["image"] for t, p in pods.items()} == {
        "learner": f"ghcr.io/kuberl/learner:{version}",
        "rollout": f"ghcr.io/kuberl/rollout:{version}",
        "sandbox": f"ghcr.io/kuberl/sandbox:{version}",
    }
    # no pull secrets named anywhere: the pods keep their ServiceAccount's
    assert all("imagePullSecrets" not in p for p in pods.values())


def test_a_registry_prefix_moves_every_image_the_job_does_not_name():
    rljob = job(rollout={"image": "quay.io/me/rollout:dev"})
    pods = pod_specs(desired_objects(rljob, "ns", owner=None, images=TEAM))
    assert pods["learner"]["containers"][0]["image"] == "registry.example.com/team/learner:1.2.3"
    assert pods["rollout"]["containers"][0]["image"] == "quay.io/me/rollout:dev"
    assert pods["sandbox"]["containers"][0]["image"] == "registry.example.com/team/sandbox:1.2.3"


def test_the_job_file_records_the_images_its_pods_run():
    objects = desired_objects(job(sandbox={"image": "quay.io/me/env:1"}), "ns", owner=None, images=TEAM)
    [config] = [o for o in objects if o["kind"] == "ConfigMap"]
    spec = yaml.safe_load(config["data"]["job.yaml"])["spec"]
    assert spec["learner"]["image"] == "registry.example.com/team/learner:1.2.3"
    assert spec["sandbox"]["image"] == "quay.io/me/env:1"


def test_the_local_version_suffix_becomes_a_valid_tag():
    assert release_tag("0.2.0+g1234") == "0.2.0-g1234"
    assert release_tag("0.1.0") == "0.1.0"


# ------------------------------------------------------------------------------ running jobs
@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Api, Kube]]:
    with emulated_api_server() as url:
        kubeconfig = write_kubeconfig(tmp_path_factory.mktemp("images") / "kubeconfig", url, "default")
        yield Api(url), Kube(kube_config.new_client_from_config(str(kubeconfig)))


def stored_pods(api: Api, name: str) -> dict[str, dict[str, Any]]:
    paths = {
        "learner": f"/apis/apps/v1/namespaces/default/statefulsets/{name}-learner",
        "rollout": f"/apis/apps/v1/namespaces/default/statefulsets/{name}-rollout",
        "sandbox": f"/apis/apps/v1/namespaces/default/deployments/{name}-sandbox",
    }
    return {tier: api.get(path)["spec"]["template"]["spec"] for tier, path in paths.items()}


def test_a_new_default_never_changes_the_images_of_a_running_job(server):
    api, kube = server
    old, new = JobImages(registry="old.example.com/team", tag="1.0.0"), TEAM
    running = RLJob.model_validate({"metadata": {"name": "running", "namespace": "default"}, "spec": {}})
    apply_children(kube, running, "default", "uid-running", scaled_down=False, new=True, images=old)
    # the operator is upgraded, or pointed at another registry, and applies the job again
    apply_children(kube, running, "default", "uid-running", scaled_down=False, images=new)
    pods = stored_pods(api, "running")
    assert {t: p["containers"][0]["image"] for t, p in pods.items()} == {
        t: f"old.example.com/team/{t}:1.0.0" for t in ("learner", "rollout", "sandbox")
    }
    assert all(secrets_of(p) == ["regcred", "mirror-pull"] for p in pods.values())  # pull secrets do follow
    # what the job names is applied as it changes; a job created now gets the new defaults
    named = running.model_copy(deep=True)
    named.spec.rollout.image = "quay.io/me/rollout:dev"
    apply_children(kube, named, "default", "uid-running", scaled_down=False, images=new)
    assert stored_pods(api, "running")["rollout"]["containers"][0]["image"] == "quay.io/me/rollout:dev"
    fresh = running.model_copy(update={"metadata": running.metadata.model_copy(update={"name": "fresh"})})
    apply_children(kube, fresh, "default", "uid-fresh", scaled_down=False, new=True, images=new)
    assert stored_pods(api, "fresh")["learner"]["containers"][0]["image"] == "registry.example.com/team/learner:1.2.3"


# ------------------------------------------------------------------------------ pull secrets
def test_tier_pull_secrets_come_first_then_the_defaults_without_duplicates():
    rljob = job(
        learner={"imagePullSecrets": [{"name": "learner-pull"}, {"name": "regcred"}]},
        sandbox={"imagePullSecrets": [{"name": "env-pull"}, {"name": "env-pull"}]},
    )
    pods = pod_specs(desired_objects(rljob, "ns", owner=None, images=TEAM))
    assert secrets_of(pods["learner"]) == ["learner-pull", "regcred", "mirror-pull"]
    assert secrets_of(pods["rollout"]) == ["regcred", "mirror-pull"]
    assert secrets_of(pods["sandbox"]) == ["env-pull", "regcred", "mirror-pull"]


def test_a_tier_pull_secret_alone_reaches_only_its_own_pods():
    rljob = job(rollout={"imagePullSecrets": [{"name": "rollout-pull"}]})
    pods = pod_specs(desired_objects(rljob, "ns", owner=None, images=JobImages()))
    assert secrets_of(pods["rollout"]) == ["rollout-pull"]
    assert "imagePullSecrets" not in pods["learner"] and "imagePullSecrets" not in pods["sandbox"]


def test_a_queued_jobs_kueue_pod_sets_carry_the_pull_secrets():
    rljob = job(scheduling={"queueName": "team-queue"}, learner={"imagePullSecrets": [{"name": "learner-pull"}]})
    [workload] = [o for o in desired_objects(rljob, "ns", owner=None, images=TEAM) if o["kind"] == "Workload"]
    sets = {p["name"]: p["template"]["spec"] for p in workload["spec"]["podSets"]}
    assert secrets_of(sets["learner"]) == ["learner-pull", "regcred", "mirror-pull"]
    assert secrets_of(sets["rollout"]) == ["regcred", "mirror-pull"]


# ------------------------------------------------------------------------------ the operator's environment
def test_the_operator_reads_its_defaults_from_the_charts_variables():
    env = {
        env_vars.OPERATOR_JOB_IMAGE_REGISTRY: "registry.example.com:5000/team/",
        env_vars.OPERATOR_JOB_IMAGE_TAG: "2.0.0-rc.1",
        env_vars.OPERATOR_JOB_IMAGE_PULL_SECRETS: "regcred, mirror-pull,,regcred",
    }
    assert OperatorConfig.from_env(env).job_images == JobImages(
        registry="registry.example.com:5000/team", tag="2.0.0-rc.1", pull_secrets=("regcred", "mirror-pull")
    )
    empty = {env_vars.OPERATOR_JOB_IMAGE_REGISTRY: "", env_vars.OPERATOR_JOB_IMAGE_TAG: ""}
    assert OperatorConfig.from_env(empty).job_images == JobImages() == OperatorConfig.from_env({}).job_images


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (env_vars.OPERATOR_JOB_IMAGE_REGISTRY, "https://registry.example.com/team"),
        (env_vars.OPERATOR_JOB_IMAGE_REGISTRY, "registry.example.com/team/learner:1.0"),
        (env_vars.OPERATOR_JOB_IMAGE_REGISTRY, "registry.example.com/Team"),
        (env_vars.OPERATOR_JOB_IMAGE_TAG, "1.0+local"),
        (env_vars.OPERATOR_JOB_IMAGE_PULL_SECRETS, "regcred,Reg_Cred"),
    ],
    ids=["scheme", "tag-in-prefix", "uppercase-path", "plus-in-tag", "bad-secret"],
)
def test_a_bad_default_stops_the_operator_naming_its_variable(variable, value):
    with pytest.raises(ValueError, match=variable) as err:
        JobImages.from_env({variable: value})
    assert repr(value.split(",")[-1]) in str(err.value) or repr(value) in str(err.value)


# ------------------------------------------------------------------------------ kuberl render
def test_render_shows_tier_and_cluster_pull_secrets_as_valid_kubernetes(tmp_path):
    manifest = with_spec(
        learner={"imagePullSecrets": [{"name": "learner-pull"}]},
        rollout={"imagePullSecrets": [{"name": "regcred"}]},
        sandbox={"image": "registry.example.com/team/sandbox-swe:1.2.3", "imagePullSecrets": [{"name": "env-pull"}]},
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    # `kuberl render` applies the same defaults as an operator with this environment (the chart's jobDefaults)
    env = {
        **os.environ,
        env_vars.OPERATOR_JOB_IMAGE_REGISTRY: "registry.example.com/team",
        env_vars.OPERATOR_JOB_IMAGE_TAG: "1.2.3",
        env_vars.OPERATOR_JOB_IMAGE_PULL_SECRETS: "regcred",
    }
    result = subprocess.run(
        [str(BIN / "kuberl"), "render", str(path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    objects = [o for o in yaml.safe_load_all(result.stdout) if o]
    for obj in objects:
        kubernetes_validate.validate(obj, NEWEST, strict=True)
    pods = pod_specs(objects)
    assert secrets_of(pods["learner"]) == ["learner-pull", "regcred"]
    assert secrets_of(pods["rollout"]) == ["regcred"]
    assert secrets_of(pods["sandbox"]) == ["env-pull", "regcred"]
    images = {t: p["containers"][0]["image"] for t, p in pods.items()}
    assert images == {
        "learner": "registry.example.com/team/learner:1.2.3",
        "rollout": "registry.example.com/team/rollout:1.2.3",
        "sandbox": "registry.example.com/team/sandbox-swe:1.2.3",
    }
