"""Each image carries the OCI labels of what it is (version, commit, source, title, licence), its user and
its tag as the chart and the operator name it; `--push` copies it with skopeo, labels and all."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest
from conftest import REPO
from helpers.built_images import built_image, can_build, exclusive_build, image_config

pytestmark = pytest.mark.slow

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module", params=["operator", "sandbox"])
def image(request) -> tuple[str, str]:
    if reason := can_build():
        pytest.skip(reason)
    return request.param, built_image(request.param)


def test_tags_are_the_charts_defaults(image):
    tier, reference = image
    assert reference == f"ghcr.io/kuberl/{tier}:{VERSION}"


def test_oci_labels(image):
    tier, reference = image
    labels = image_config(reference)["Labels"]
    assert labels["org.opencontainers.image.version"] == VERSION
    # the commit it was built from: this one, or an earlier one with the same inputs (a reused image)
    commit = labels["org.opencontainers.image.revision"].removesuffix("-dirty")
    ancestor = subprocess.run(["git", "-C", str(REPO), "merge-base", "--is-ancestor", commit, "HEAD"])
    assert ancestor.returncode == 0, f"revision {commit} is not a commit of this history"
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert labels["org.opencontainers.image.title"] == f"KubeRL {tier}"
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_push_copies_the_image_with_its_labels(image, tmp_path):
    tier, reference = image
    build = [sys.executable, str(REPO / "images/build.py"), "--tiers", tier, "--push", f"oci-archive:{tmp_path}"]
    with exclusive_build():  # the builder may rebuild the tier: not beside another build
        subprocess.run(build, check=True, capture_output=True)
    archive = tmp_path / f"{tier}-{VERSION}.tar"
    inspect = subprocess.run(["skopeo", "inspect", f"oci-archive:{archive}"], capture_output=True, text=True)
    assert inspect.returncode == 0, inspect.stderr
    pushed = json.loads(inspect.stdout)
    assert pushed["Labels"] == image_config(reference)["Labels"]


def test_push_refuses_a_destination_that_is_not_a_registry_path():
    out = subprocess.run(
        [sys.executable, str(REPO / "images/build.py"), "--push", "https://registry.example.com/team"],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "REGISTRY/PREFIX" in out.stderr
