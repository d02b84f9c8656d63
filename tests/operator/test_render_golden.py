"""`kuberl render`: the examples' YAML streams match the golden files, and bad input fails like `kuberl validate`.

Regenerate the golden files after an intended change with:
    KUBERL_UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/operator/test_render_golden.py -p no:cacheprovider
and review the diff like code.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from conftest import EXAMPLES
from helpers.kuberl_cli import kuberl_here

from kuberl.validation import load_rljob
from kuberl_operator.desired import desired_objects, render_yaml_stream, target_namespace
from kuberl_operator.meta import owner_reference

GOLDEN = Path(__file__).parent / "golden"
UID = "00000000-0000-4000-8000-000000000000"
UPDATE = os.environ.get("KUBERL_UPDATE_GOLDEN") == "1"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_rendered_example_matches_its_golden_file(path):
    job = load_rljob(str(path))
    text = render_yaml_stream(desired_objects(job, target_namespace(job), owner=owner_reference(job, UID)))
    golden = GOLDEN / f"{path.stem}.yaml"
    if UPDATE:
        golden.write_text(text)
    assert golden.exists(), f"missing {golden}; create it with KUBERL_UPDATE_GOLDEN=1"
    assert text == golden.read_text(), f"{golden} differs; if intended, regenerate (see this module's docstring)"


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_the_command_prints_the_golden_stream(path):
    result = kuberl_here("render", str(path), "--uid", UID)
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN / f"{path.stem}.yaml").read_text()
    assert "Secret" in result.stderr  # tells the user which Secret the pods read


def test_namespace_option_wins_and_no_uid_means_no_owner_references():
    result = kuberl_here("render", str(EXAMPLES[0]), "--namespace", "team-b")
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    assert {o["metadata"]["namespace"] for o in objects} == {"team-b"}
    assert all("ownerReferences" not in o["metadata"] for o in objects)
    assert "no --uid" in result.stderr


def test_bad_input_fails_with_the_lines_validate_gives(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: kuberl.io/v1alpha1\nkind: RLJob\nmetadata: {name: x}\n"
        "spec: {learner: {replicas: 0}, sandbox: {egres: allow}}\n"
    )
    rendered, validated = kuberl_here("render", str(bad)), kuberl_here("validate", str(bad))
    assert rendered.returncode == validated.returncode == 2
    assert rendered.stdout == ""
    problems = [line for line in validated.stderr.splitlines() if not line.endswith("invalid")]
    assert rendered.stderr.splitlines() == problems
    assert any("spec.learner.replicas" in line for line in problems)
    assert "Traceback" not in rendered.stderr


def test_a_missing_file_is_one_line(tmp_path):
    result = kuberl_here("render", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert result.stderr.strip() == f"{tmp_path / 'nope.yaml'}: file not found"
