"""`kuberl plan` with spec.model.lora: the base is frozen (no gradients, no optimizer state, no reference
copy), and the adapters' parameters are counted by hand and equal those PEFT creates."""

from __future__ import annotations

import pytest

from kuberl.api.spec import LoraSpec, RLJobSpec
from kuberl.modeling.lora import adapter_parameter_count
from kuberl.planning import lora_parameters, model_shape_from_config, plan_memory, read_model_shape
from recipes.swe_toy.tiny_model import build_tiny_model

# hidden 8, 2 layers, 2 query heads and 1 key/value head of width 4, MLP 16, vocabulary 32, untied (1704 parameters)
SHAPE = model_shape_from_config(
    {
        "hidden_size": 8,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 4,
        "intermediate_size": 16,
        "vocab_size": 32,
        "tie_word_embeddings": False,
    }
)
# a Qwen2.5-1.5B-like decoder
LARGE = model_shape_from_config(
    {
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }
)
CPU_POD = {"requests": {"cpu": 1, "memory": "1Gi"}}


def spec(lora: dict | None, kl_coef: float = 0.0, replicas: int = 1) -> RLJobSpec:
    model = {"uri": "unused", "maxContextTokens": 256, **({"lora": lora} if lora is not None else {})}
    return RLJobSpec.model_validate(
        {
            "model": model,
            "environment": {"maxTokensPerTrajectory": 256},
            "algorithm": {"groupSize": 2, "klCoef": kl_coef},
            "training": {"trajectoriesPerStep": 8},
            "learner": {"replicas": replicas, "resources": CPU_POD},
            "rollout": {"resources": CPU_POD},
        }
    )


def test_adapter_parameters_of_a_known_config():
    # r x (in + out): q 8+8, k 8+4, v 8+4, o 8+8, gate 8+16, up 8+16, down 16+8 = 128 per block and rank
    assert lora_parameters(SHAPE, LoraSpec(rank=2)) == 2 * 2 * 128 == 512
    assert lora_parameters(SHAPE, LoraSpec(rank=2, target_modules=["q_proj", "v_proj"])) == 2 * 2 * (16 + 12)
    assert lora_parameters(SHAPE, LoraSpec(rank=2, target_modules=["self_attn.o_proj"])) == 2 * 2 * 16


@pytest.mark.parametrize("targets", [["all-linear"], ["q_proj", "v_proj"], ["down_proj"]])
def test_the_count_is_the_adapters_peft_creates(tmp_path, targets):
    folder = build_tiny_model(tmp_path / "m", hidden_size=64, layers=2, seed=5)
    lora = LoraSpec(rank=4, target_modules=targets)
    assert lora_parameters(read_model_shape(str(folder)), lora) == adapter_parameter_count(folder, lora)


def test_the_base_is_frozen_and_is_its_own_reference():
    learner = plan_memory(spec({"rank": 2}, kl_coef=0.1), SHAPE).learner
    assert learner.trainable_parameters == 512
    assert (learner.weights, learner.gradients, learner.optimizer) == ((1704 + 512) * 4, 512 * 4, 512 * 8)
    assert learner.reference == 0  # the base with adapters disabled: no copy
    full = plan_memory(spec(None, kl_coef=0.1), SHAPE).learner
    assert full.trainable_parameters == 1704 and full.reference == 1704 * 4


def test_lora_memory_is_far_below_full_fine_tuning():
    lora, full = (plan_memory(spec(x, kl_coef=0.05, replicas=2), LARGE).learner for x in ({"rank": 16}, None))
    trained = lora_parameters(LARGE, LoraSpec(rank=16))
    assert trained < LARGE.parameters / 50
    assert lora.gradients + lora.optimizer == pytest.approx(trained * 12 / 2, abs=2)
    states = lora.weights + lora.gradients + lora.optimizer + lora.reference
    assert states < 0.3 * (full.weights + full.gradients + full.optimizer + full.reference)
    assert lora.peak < full.peak
