"""The LoRA rule both tiers share: the names and shapes of the adapter tensors are those PEFT saves, and the
adapter_config.json is one PEFT reads back."""

from __future__ import annotations

import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    adapter_config_json,
    adapter_parameter_count,
    adapter_tensor_shapes,
    peft_config,
)
from recipes.swe_toy.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "m", hidden_size=64, layers=2, seed=5)


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"]])
def test_the_shapes_are_the_tensors_peft_saves(tiny, tmp_path, targets):
    lora = LoraSpec(rank=4, alpha=8, target_modules=targets)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny), peft_config(lora))
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / ADAPTER_WEIGHTS)
    assert adapter_tensor_shapes(tiny, lora) == {name: tuple(t.shape) for name, t in saved.items()}
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in saved
    assert saved["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"].shape == (4, 64)
    written = json.loads((tmp_path / ADAPTER_CONFIG).read_text())
    ours = adapter_config_json(lora, str(tiny))
    written["base_model_name_or_path"] = str(tiny)
    assert sorted(ours["target_modules"]) == sorted(written["target_modules"])
    assert {k: v for k, v in ours.items() if k != "target_modules"} == {
        k: v for k, v in written.items() if k != "target_modules"
    }


def test_all_linear_adapts_every_linear_layer_but_the_head(tiny):
    shapes = adapter_tensor_shapes(tiny, LoraSpec(rank=2))
    assert not any("lm_head" in name for name in shapes)
    assert len(shapes) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    assert adapter_parameter_count(tiny, LoraSpec(rank=2)) == sum(torch.Size(s).numel() for s in shapes.values())


def test_the_config_is_peft_s_own(tiny, tmp_path):
    lora = LoraSpec(rank=8, alpha=16, dropout=0.1, target_modules=["q_proj"])
    config = peft_config(lora)
    assert (config.r, config.lora_alpha, config.lora_dropout, config.task_type) == (8, 16, 0.1, "CAUSAL_LM")
    assert peft_config(LoraSpec()).target_modules == "all-linear"
    (tmp_path / ADAPTER_CONFIG).write_text(json.dumps(adapter_config_json(lora, "org/base")))
    read = LoraConfig.from_pretrained(tmp_path)
    assert (read.r, read.lora_alpha, read.base_model_name_or_path) == (8, 16, "org/base")
    assert set(read.target_modules) == {"q_proj"} and read.inference_mode
