"""The operator image runs `kuberl` as uid 65532, without network, and its entry point starts the operator's
command line (kopf, the Kubernetes client and the API models import)."""

from __future__ import annotations

import tomllib

import pytest
from conftest import REPO
from helpers.built_images import built_image, can_build, image_rootfs, podman_run

pytestmark = pytest.mark.slow

VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def operator_image() -> str:
    if reason := can_build():
        pytest.skip(reason)
    return built_image("operator")


def test_kuberl_version_runs_as_the_non_root_user(operator_image):
    out = podman_run(operator_image, "-c", "id -u; id -g; kuberl --version", options=("--entrypoint", "sh"))
    assert out.split("\n")[:3] == ["65532", "65532", f"kuberl {VERSION}"]


def test_the_entry_point_is_the_operator_command(operator_image):
    out = podman_run(operator_image, "--help")  # ENTRYPOINT kuberl operator; --help replaces the CMD
    assert "--liveness" in out and "--metrics-port" in out, out


def test_the_root_filesystem_unpacks_for_other_tests(operator_image, tmp_path):
    rootfs = image_rootfs("operator", tmp_path / "rootfs")
    assert "VERSION_CODENAME=bookworm" in (rootfs / "etc/os-release").read_text()
    kuberl = rootfs / "opt/kuberl/bin/kuberl"
    assert kuberl.is_file() and kuberl.stat().st_uid == 0  # the non-root user cannot change the installation
