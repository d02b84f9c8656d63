"""Property: any RLJob-shaped document either validates or gets problems that each name a field;
nothing raises. What pydantic accepts, the CRD (schema and CEL rules) accepts too."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
from conftest import BASE_MANIFEST
from helpers.crd_schema import apply_defaults, cel_violations
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kuberl.api import RLJob
from kuberl.crd import rljob_crd

OPENAPI = rljob_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
TOP_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}


def _leaves(node: dict[str, Any], path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], dict[str, Any]]]:
    out = [(path, node)] if path else []
    for key, sub in node.get("properties", {}).items():
        out += _leaves(sub, (*path, key))
    return out


SPEC_FIELDS = [(p, n) for p, n in _leaves(OPENAPI) if p[0] == "spec" and len(p) > 1]

garbage = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(), max_size=3),
)


def plausible(node: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Mostly well-typed values near the edges of the schema's ranges."""
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "integer":
        return st.integers(node.get("minimum", -5) - 2, min(node.get("maximum", 10**6), 10**6) + 2)
    if kind == "number":
        return st.floats(-1.0, node.get("maximum", 100.0) + 1.0, allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    if kind == "string":
        return st.sampled_from(["30m", "36h", "1h30m", "0s", "s3://bkt/x", "file:///m", "./m", "gs://b", "ok", ""])
    if node.get("x-kubernetes-int-or-string"):
        return st.one_of(st.integers(-1, 64), st.sampled_from(["500m", "16Gi", "1.5", "lots"]))
    return st.just({})


@st.composite
def mutated_manifests(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(BASE_MANIFEST)
    for _ in range(draw(st.integers(1, 6))):
        path, node = draw(st.sampled_from(SPEC_FIELDS))
        value = draw(st.one_of(plausible(node), plausible(node), garbage))
        target = doc
        for key in path[:-1]:
            if not isinstance(target.get(key), dict):
                target[key] = {}
            target = target[key]
        target[path[-1]] = value
    if draw(st.booleans()):
        doc["spec"][draw(st.text(min_size=1, max_size=8))] = draw(garbage)
    return doc


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_manifests())
def test_every_document_validates_or_names_a_field(doc):
    from kuberl.validation import validate_document

    result = validate_document(doc, "gen.yaml")
    if result.ok:
        assert result.job is not None
        manifest = result.job.to_manifest()
        assert RLJob.model_validate(manifest) == result.job  # the wire form round-trips
        stored = apply_defaults(OPENAPI, doc)
        jsonschema.Draft4Validator(OPENAPI).validate(stored)
        assert cel_violations(OPENAPI, stored) == []
        return
    assert result.problems
    for problem in result.problems:
        assert problem.path.split(".")[0].split("[")[0] in TOP_FIELDS, problem
        assert problem.message and "Traceback" not in problem.message


@settings(max_examples=100, deadline=None)
@given(st.recursive(garbage, lambda inner: st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12))
def test_arbitrary_documents_never_raise(doc):
    from kuberl.validation import validate_document

    result = validate_document(doc, "gen.yaml")
    assert result.ok or result.problems
