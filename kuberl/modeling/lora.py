"""The one LoRA rule the learner and the rollout tier share: the PEFT config of `spec.model.lora`, the
adapter_config.json the rollout writes beside received tensors, and the adapter tensors' names and shapes.

Tensor names are those of PEFT's adapter_model.safetensors (the adapter name left out), e.g.
`base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`: what the learner sends, what vLLM loads.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from kuberl.api.spec import LoraSpec

if TYPE_CHECKING:
    import peft

ALL_LINEAR = "all-linear"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."  # of every adapter tensor name: the PeftModel, then its LoraModel


def peft_config(lora: LoraSpec) -> peft.LoraConfig:
    """The learner's PEFT config: a causal LM's adapters of rank r on `target_modules` ("all-linear" as PEFT's
    own string: every linear layer but the output head)."""
    from peft import LoraConfig

    targets: str | list[str] = ALL_LINEAR if lora.target_modules == [ALL_LINEAR] else list(lora.target_modules)
    return LoraConfig(
        task_type="CAUSAL_LM",
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
    )


def adapter_config_json(lora: LoraSpec, base_model: str) -> dict:
    """adapter_config.json as PeftModel.save_pretrained writes it (inference mode, the base model's name).
    When `base_model` is a local folder, "all-linear" becomes the adapted modules' paths, as PEFT writes them."""
    config = peft_config(lora)
    config.base_model_name_or_path = base_model
    config.inference_mode = True
    if config.target_modules == ALL_LINEAR and (Path(base_model) / "config.json").is_file():
        config.target_modules = set(_module_names(adapter_tensor_shapes(base_model, lora)))
    data = config.to_dict()
    for key, value in data.items():
        if isinstance(value, set):
            data[key] = sorted(value)
    return json.loads(json.dumps(data))  # enums to their strings: what reading the file back gives


def adapter_tensor_shapes(model_folder: str | Path, lora: LoraSpec) -> dict[str, tuple[int, ...]]:
    """Adapter tensor names as PEFT saves them and their shapes, from the folder's config.json alone: the model
    is built on the meta device (no weights read, nothing allocated)."""
    import torch
    from peft import get_peft_model, get_peft_model_state_dict
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(model_folder))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
        model = get_peft_model(model, peft_config(lora))
    return {name: tuple(t.shape) for name, t in get_peft_model_state_dict(model).items()}


def adapter_parameter_count(model_folder: str | Path, lora: LoraSpec) -> int:
    """Trainable parameters of the adapters (every lora_A and lora_B element)."""
    total = 0
    for shape in adapter_tensor_shapes(model_folder, lora).values():
        count = 1
        for dim in shape:
            count *= dim
        total += count
    return total


def _module_names(shapes: dict[str, tuple[int, ...]]) -> list[str]:
    """The adapted modules' paths in the base model (model.layers.0.mlp.down_proj, ...), as PEFT lists them."""
    return sorted({name.split(".lora_")[0].removeprefix(PEFT_PREFIX) for name in shapes})
