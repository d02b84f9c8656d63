"""spec.<tier>.imagePullSecrets: Kubernetes' own shape ([{name: regcred}]), Secret names checked as DNS
subdomains by `kuberl validate` and by the CRD alike, with the field named in the message."""

from __future__ import annotations

import jsonschema
import pytest
from conftest import with_spec

from kuberl.api import RLJob
from kuberl.crd import rljob_crd
from kuberl.validation import validate_document

TIERS = ("learner", "rollout", "sandbox")


def problems(doc: dict) -> list[str]:
    return [str(p) for p in validate_document(doc, "job.yaml").problems]


def crd_errors(doc: dict) -> list[str]:
    schema = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(doc)]


@pytest.mark.parametrize("tier", TIERS)
def test_each_tier_takes_pull_secrets_in_the_kubernetes_shape(tier):
    doc = with_spec(**{tier: {"imagePullSecrets": [{"name": "regcred"}, {"name": "team.mirror-pull"}]}})
    job = RLJob.model_validate(doc)
    assert [s.name for s in getattr(job.spec, tier).image_pull_secrets] == ["regcred", "team.mirror-pull"]
    assert job.spec.to_manifest()[tier]["imagePullSecrets"] == doc["spec"][tier]["imagePullSecrets"]
    assert problems(doc) == [] and crd_errors(doc) == []


def test_unset_means_none_and_no_image_means_the_operators_default():
    job = RLJob.model_validate(with_spec())
    for tier in TIERS:
        section = getattr(job.spec, tier)
        assert section.image_pull_secrets == [] and section.image is None


@pytest.mark.parametrize(
    ("secrets", "words"),
    [
        ([{"name": "RegCred"}], "DNS subdomain"),
        ([{"name": "reg_cred"}], "DNS subdomain"),
        ([{"name": "-regcred"}], "DNS subdomain"),
        ([{"name": ""}], "DNS subdomain"),
        ([{"name": "a" * 254}], "at most 253 characters (a DNS subdomain), got 254"),
        (["regcred"], "expected a mapping"),
        ([{"secret": "regcred"}], "unknown field 'secret'"),
        ([{"name": f"s{i}"} for i in range(33)], "at most 32 items"),
    ],
    ids=["uppercase", "underscore", "leading-dash", "empty", "too-long", "bare-name", "wrong-key", "too-many"],
)
def test_bad_pull_secrets_name_the_field(secrets, words):
    doc = with_spec(rollout={"imagePullSecrets": secrets})
    found = problems(doc)
    assert found and all("spec.rollout.imagePullSecrets" in line for line in found), found
    assert any(words in line for line in found), found
    assert crd_errors(doc), "the CRD must refuse what kuberl validate refuses"
