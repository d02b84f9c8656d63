"""FSDP2 on 2 CPU processes (gloo, under torchrun) trains exactly like 1 process on the same global batch."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import REPO

from kuberl.modeling.tiny import build_tiny_model

pytestmark = pytest.mark.slow


def run(world: int, model, out) -> list[float]:
    argv = [str(REPO / ".venv/bin/torchrun"), "--standalone", "--nproc_per_node", str(world),
            "-m", "kuberl_trainer.equivalence", str(model), str(out)]  # fmt: skip
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["world_size"] == world
    return report["losses"]


def test_two_ranks_give_the_loss_trajectory_of_one(tmp_path):
    model = build_tiny_model(tmp_path / "m", hidden_size=64, layers=2, seed=5)
    one, two = run(1, model, tmp_path / "one.json"), run(2, model, tmp_path / "two.json")
    assert len(one) == 3 and one[0] != one[-1]  # it trains
    assert one == pytest.approx(two, abs=1e-5)
