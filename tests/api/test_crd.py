"""The CRD is generated from the models, is structural, valid Kubernetes, and defaults like pydantic."""

from __future__ import annotations

import subprocess
from typing import Any

import jsonschema
import pytest
import yaml
from conftest import BASE_MANIFEST, BIN, EXAMPLES, REPO
from helpers.crd_schema import apply_defaults, cel_violations

from kuberl.api import RLJob
from kuberl.crd import rljob_crd, rljob_crd_yaml

CRD_FILE = REPO / "crds" / "rljob.yaml"
KUBERL = str(BIN / "kuberl")


def openapi() -> dict[str, Any]:
    return rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_kuberl_crds_prints_exactly_the_committed_file():
    printed = subprocess.run([KUBERL, "crds"], capture_output=True, text=True, check=True).stdout
    assert printed == CRD_FILE.read_text(), "crds/rljob.yaml is stale: run `make crds`"
    assert printed == rljob_crd_yaml()


def test_crd_passes_kubernetes_validate_strict(tmp_path):
    result = subprocess.run(
        [str(BIN / "kubernetes-validate"), "--strict", "-k", "1.30.0", str(CRD_FILE)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "passed for resource customresourcedefinition/rljobs.kuberl.io" in result.stdout


def _walk(node: dict[str, Any], path: str = "$"):
    yield path, node
    for key, sub in node.get("properties", {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_schema_is_structural():
    """The rules of a structural schema that the API server enforces on CRDs."""
    for path, node in _walk(openapi()):
        assert "$ref" not in node and "$defs" not in node and "title" not in node, path
        int_or_string = node.get("x-kubernetes-int-or-string")
        assert ("type" in node) != bool(int_or_string), f"{path} needs exactly one of type / int-or-string"
        if int_or_string:
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node and "oneOf" not in node, path
        if "properties" in node:
            assert node["type"] == "object" and "additionalProperties" not in node, path
        assert node.get("additionalProperties") is not False, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be boolean in OpenAPI v3"
        if path.count(".") >= 2 and not path.endswith(("*", "[]")):
            assert node.get("description"), f"{path} has no description"


def test_crd_has_status_subresource_printer_columns_and_short_name():
    crd = rljob_crd()
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Phase"] == ".status.phase" and columns["Step"] == ".status.step"
    assert columns["Reward"] == ".status.rewardMean" and columns["Age"] == ".metadata.creationTimestamp"
    assert crd["spec"]["names"]["shortNames"] == ["rlj"]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_validate_against_the_crd_schema(example):
    doc = yaml.safe_load(example.read_text())
    jsonschema.Draft4Validator(openapi()).validate(doc)
    assert cel_violations(openapi(), apply_defaults(openapi(), doc)) == []


def test_crd_defaults_equal_pydantic_defaults():
    """What the API server stores for a minimal manifest is what pydantic builds from it."""
    defaulted = apply_defaults(openapi(), BASE_MANIFEST)
    assert _without_empty(defaulted["spec"]) == _without_empty(RLJob.model_validate(BASE_MANIFEST).spec.to_manifest())


def _without_empty(value: Any) -> Any:
    """Empty maps and lists left out: for Kubernetes an absent list and an empty one are the same."""
    if isinstance(value, dict):
        pruned = {k: _without_empty(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v not in ({}, [])}
    return value


def test_crd_rejects_wrong_types_and_ranges_like_pydantic():
    bad = {**BASE_MANIFEST, "spec": {"sandbox": {"maxReplicas": 0}, "training": {"learningRate": 0}}}
    errors = sorted(e.message for e in jsonschema.Draft4Validator(openapi()).iter_errors(bad))
    assert any("0 is less than the minimum of 1" in e for e in errors), errors
    assert any("less than or equal to the minimum of 0" in e for e in errors), errors


def test_field_reference_is_generated_from_the_models():
    from kuberl.reference import reference_markdown

    reference = (REPO / "docs" / "rljob.md").read_text()
    assert reference == reference_markdown(), "docs/rljob.md is stale: run `make crds`"
    for path in ("spec.sandbox.maxReplicas", "spec.limits.maxWallClock", "spec.checkpoint.async"):
        assert f"| `{path}` |" in reference
