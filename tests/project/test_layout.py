"""The project layout of the design card, and an install that a second run leaves alone."""

from __future__ import annotations

import importlib
import subprocess
import tomllib

import pytest
from conftest import REPO

PACKAGES = {
    "kuberl": "kuberl",
    "kuberl_app": "app/kuberl_app",
    "kuberl_operator": "operator/kuberl_operator",
    "kuberl_trainer": "trainer/kuberl_trainer",
    "kuberl_rollout": "rollout-server/kuberl_rollout",
    "kuberl_sandbox": "env-images/kuberl_sandbox",
    "recipes": "recipes",
}


@pytest.mark.parametrize(
    "folder",
    [
        "app",
        "operator",
        "crds",
        "charts",
        "trainer",
        "rollout-server",
        "env-images",
        "tests",
        "examples",
        "benchmarks",
        "docs",
    ],
)
def test_design_card_folders_exist(folder):
    assert (REPO / folder).is_dir()


@pytest.mark.parametrize(("package", "folder"), PACKAGES.items())
def test_each_tier_package_imports_from_its_folder(package, folder):
    module = importlib.import_module(package)
    assert module.__file__ == str(REPO / folder / "__init__.py")


def test_no_top_level_package_shadows_the_standard_library():
    import operator

    assert not (REPO / "operator" / "__init__.py").exists()
    assert "site-packages" not in (operator.__file__ or "") and hasattr(operator, "itemgetter")


def test_make_install_is_up_to_date_after_installing():
    # `make -q` exits 0 only when nothing would be rebuilt: a second `make install` does no work.
    result = subprocess.run(["make", "-q", "install"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, "make install would run again: " + result.stdout + result.stderr


def test_every_import_package_is_in_the_distribution():
    # pyproject lists packages explicitly (they live in the design card's folders); a folder missing from
    # the list works in an editable install and is silently absent from the wheel the images install
    import tomllib

    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for package, folder in PACKAGES.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(REPO / folder)
            found.add(".".join([package, *relative.parts]))
    assert found == listed, f"add to [tool.setuptools] packages: {sorted(found - listed)}"


def test_the_license_file_is_the_license_the_package_declares():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["license"]
    text = (REPO / "LICENSE").read_text()
    assert declared == "Apache-2.0"
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"] and "END OF TERMS" in text
