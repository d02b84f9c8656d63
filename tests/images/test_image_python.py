"""The images' Python against CVE-2025-4517, tried inside each image: tarfile's `data` filter must refuse a
symlink chain that resolves past PATH_MAX out of the destination (tests/images/tarfile_symlink_chain.py).

Debian bookworm's python3.11 (3.11.2 with Debian's patches, the images' base) has no extraction filters at all
(PEP 706 came in 3.11.4) and so neither the fix (3.11.13): the test is a strict expected failure that says so,
and turns into a failure the day the images' Python refuses the chain (then drop the mark). The chain itself
is checked against this process's Python: a release with filters but without the fix lets it escape."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile

import pytest
from conftest import REPO
from helpers.built_images import built_image, can_build, podman_run

pytestmark = pytest.mark.slow

CHAIN = REPO / "tests/images/tarfile_symlink_chain.py"
# releases of each line with the fix (3.14 shipped with it)
FIXED = {(3, 9): 23, (3, 10): 18, (3, 11): 13, (3, 12): 11, (3, 13): 4}


def fixed(version: tuple[int, int, int]) -> bool:
    return version[:2] >= (3, 14) or version[2] >= FIXED.get(version[:2], 10**6)


def run_chain_in(tier: str) -> dict:
    if reason := can_build():
        pytest.skip(reason)
    out = podman_run(
        built_image(tier), "/opt/test/chain.py",
        options=("--entrypoint", "python3", "--volume", f"{CHAIN}:/opt/test/chain.py:ro", "--tmpfs", "/tmp"),
    )  # fmt: skip
    return json.loads(out)


@pytest.mark.skipif(not hasattr(tarfile, "data_filter"), reason="this Python has no extraction filters")
def test_the_chain_escapes_a_python_with_filters_but_without_the_fix():
    result = json.loads(subprocess.run([sys.executable, CHAIN], capture_output=True, text=True, check=True).stdout)
    assert result["refused"] is fixed(sys.version_info[:3]), result
    assert result["escaped"] is not fixed(sys.version_info[:3]), result


@pytest.mark.xfail(
    strict=True,
    reason="Debian bookworm's python3.11 3.11.2 has neither tarfile's filters nor the CVE-2025-4517 fix "
    "(docs/images.md); the sandbox restores snapshots without tarfile's extraction",
)
@pytest.mark.parametrize("tier", ["operator", "sandbox"])
def test_the_images_python_refuses_the_chain(tier):
    result = run_chain_in(tier)
    assert result["refused"] is True and result["escaped"] is False, result


@pytest.mark.parametrize("tier", ["operator", "sandbox"])
def test_the_images_python_is_debians_without_filters(tier):
    # what the expected failure above rests on: the chain ran, and nothing was written outside
    result = run_chain_in(tier)
    assert result["python"] == "3.11.2" and result["filter_supported"] is False, result
    assert result["escaped"] is False, result
