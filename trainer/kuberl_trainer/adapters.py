"""The policy with LoRA adapters (PEFT) on a frozen base: what differs from full fine-tuning, in one place.

The PeftModel wraps the Hugging Face model; FSDP shards the wrapped model (its blocks carry the adapters), and
the trainer calls the PeftModel, which forwards `config`, `get_decoder` and the FSDP scoring method to it.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import peft_config


def with_adapters(model, lora: LoraSpec):
    """`model` wrapped with fresh adapters (lora_B zero: the policy is still the base model); only the adapters
    require grad. A value head is attached after, to the wrapped model: it trains in full and is never sent."""
    from peft import get_peft_model

    return get_peft_model(model, peft_config(lora))


def has_adapters(model) -> bool:
    """True for a PEFT-wrapped policy. Only a process that imported PEFT can hold one: one that did not (full
    fine-tuning) is not made to import it for the answer, about a second of CPU at every learner start."""
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_of(model):
    """The Hugging Face model inside a PEFT wrapper (the model itself without one)."""
    return model.get_base_model() if has_adapters(model) else model


def trainable_parameters(model) -> list[torch.nn.Parameter]:
    """What the optimizer holds: every parameter in full fine-tuning, the adapters (and value head) with LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def adapter_tensors(model) -> dict[str, torch.Tensor]:
    """The adapters on CPU under the names of PEFT's adapter_model.safetensors (every rank must call this when
    sharded: only the adapters are gathered, never the frozen base)."""
    from peft import get_peft_model_state_dict
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if dist.is_initialized():
        options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=True)
        state = get_model_state_dict(model, options=options)
    else:
        state = {n: p for n, p in model.named_parameters() if p.requires_grad}
    tensors = get_peft_model_state_dict(model, state_dict=state)
    return {n: t.detach().to("cpu").contiguous() for n, t in tensors.items()}
