"""LoRA under FSDP2 on 2 CPU processes (gloo, under torchrun) trains exactly like 1 process, the adapters
gathered from the shards for sending are the 1-process ones, and a sharded checkpoint resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BIN, REPO
from safetensors.torch import load_file

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import adapter_tensor_shapes
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow


def run(world: int, model: Path, folder: Path) -> dict:
    script = Path(__file__).with_name("fsdp_lora_run.py")
    argv = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(world), str(script), str(model), str(folder)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((folder / f"world{world}.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora_fsdp")
    model = build_tiny_model(folder / "m", hidden_size=64, layers=2, seed=5)
    return model, folder, run(1, model, folder), run(2, model, folder)


def test_two_ranks_train_the_adapters_like_one(runs):
    _, _, one, two = runs
    assert one["losses"][0] != one["losses"][-1] and one["kl_ref"] > 0  # it trains, away from its base
    assert one["losses"] == pytest.approx(two["losses"], abs=1e-5)
    assert one["kl_ref"] == pytest.approx(two["kl_ref"], abs=1e-6)


def test_the_adapters_gathered_from_the_shards_are_the_one_rank_ones(runs):
    model, folder, _, _ = runs
    one, two = load_file(folder / "adapters1.safetensors"), load_file(folder / "adapters2.safetensors")
    assert {n: tuple(t.shape) for n, t in two.items()} == adapter_tensor_shapes(model, LoraSpec(rank=4, alpha=8))
    assert all(torch.allclose(one[k], two[k], atol=5e-5) for k in one)


@pytest.mark.parametrize("world", [1, 2])
def test_a_sharded_checkpoint_of_the_adapters_resumes_exactly(runs, world):
    result = runs[1 + world]
    assert result["resumed"] == pytest.approx(result["losses"][1:], abs=1e-6)
