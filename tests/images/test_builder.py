"""images/build.py without building: the tiers it knows, where --push sends each image, what inputs decide a
rebuild, and clear errors for bad arguments."""

from __future__ import annotations

import importlib.util
import sys

import pytest
from conftest import REPO

# images/ is a folder of scripts: load the builder under a name of its own
_spec = importlib.util.spec_from_file_location("kuberl_images_build", REPO / "images/build.py")
assert _spec and _spec.loader
build = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # dataclasses look it up there
_spec.loader.exec_module(build)

VERSION = build.version()


def test_the_tiers_and_their_tags_are_the_charts_and_operators():
    assert list(build.TIERS) == ["operator", "sandbox", "learner", "rollout"]
    assert [build.reference(t) for t in build.TIERS] == [f"ghcr.io/kuberl/{t}:{VERSION}" for t in build.TIERS]
    assert all((REPO / tier.dockerfile).is_file() for tier in build.TIERS.values())


@pytest.mark.parametrize(
    ("prefix", "target"),
    [
        ("registry.example.com/team", f"docker://registry.example.com/team/operator:{VERSION}"),
        ("localhost:5000/kuberl/", f"docker://localhost:5000/kuberl/operator:{VERSION}"),
        ("oci-archive:/tmp/out", f"oci-archive:/tmp/out/operator-{VERSION}.tar:ghcr.io/kuberl/operator:{VERSION}"),
        ("oci:/tmp/out/", f"oci:/tmp/out/operator-{VERSION}:ghcr.io/kuberl/operator:{VERSION}"),
        ("dir:/tmp/out", f"dir:/tmp/out/operator-{VERSION}"),
    ],
)
def test_push_targets(prefix, target):
    assert build.push_target(prefix, "operator") == target


@pytest.mark.parametrize("prefix", ["https://registry.example.com/team", "/tmp/out", "/"])
def test_push_refuses_what_is_not_a_registry_path(prefix):
    with pytest.raises(SystemExit, match="REGISTRY/PREFIX"):
        build.push_target(prefix, "operator")


def test_unknown_tiers_are_named():
    with pytest.raises(Exception, match=r"trainer.*operator,sandbox,learner,rollout"):
        build.parse_tiers("operator,trainer")


def test_the_inputs_are_the_dockerfile_its_copies_and_the_build_arguments(tmp_path, monkeypatch):
    dockerfile = tmp_path / "Dockerfile"
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("a = 1\n")
    dockerfile.write_text("FROM x AS b\nCOPY src ./src\nCOPY --from=b /x /x\n")
    monkeypatch.setattr(build, "REPO", tmp_path)
    tier = build.Tier("t", "Dockerfile")
    assert build.copied_paths(dockerfile) == [tmp_path / "src"]
    first = build.inputs_digest(tier, {"BASE": "b1"})
    assert build.inputs_digest(tier, {"BASE": "b1"}) == first
    assert build.inputs_digest(tier, {"BASE": "b2"}) != first
    (tmp_path / "src/__pycache__").mkdir()
    (tmp_path / "src/__pycache__/a.cpython-311.pyc").write_bytes(b"\0")
    assert build.inputs_digest(tier, {"BASE": "b1"}) == first  # bytecode is not an input
    (tmp_path / "src/a.py").write_text("a = 2\n")
    assert build.inputs_digest(tier, {"BASE": "b1"}) != first
