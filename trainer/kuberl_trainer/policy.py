"""Load the policy and wrap it with FSDP2: `fully_shard` per decoder block, then the root."""

from __future__ import annotations

import torch
import torch.distributed as dist

from kuberl.api.spec import FsdpSpec, LoraSpec, RLJobSpec
from kuberl.planning import pod_memory, read_model_shape, resolve_micro_batch_tokens
from kuberl.storage import check_model_folder
from kuberl_trainer.adapters import base_of, with_adapters
from kuberl_trainer.token_scores import enable_fsdp_scoring
from kuberl_trainer.value_head import VALUE_HEAD, attach_value_head


def load_policy(
    model_path: str,
    fsdp: FsdpSpec,
    device: torch.device,
    value_head: bool = False,
    trainable: bool = True,
    lora: LoraSpec | None = None,
):
    """A Hugging Face causal LM in float32 master weights, sharded when a process group exists; with
    `value_head` also PPO's value head; `trainable=False` gives a frozen copy (the KL reference); `lora`
    wraps a trainable policy with PEFT adapters on the frozen base (kuberl_trainer/adapters.py)."""
    from transformers import AutoModelForCausalLM

    check_model_folder(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.config.use_cache = False
    policy = with_adapters(model, lora) if lora is not None and trainable else model
    if value_head:
        attach_value_head(model)  # after the adapters: "all-linear" would adapt the value head too
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    elif fsdp.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # Hugging Face recomputes only in training mode, and from_pretrained returns a model in eval mode:
        # without this, activationCheckpointing: true recomputed nothing. Training mode would also switch on
        # dropout, which the rollout engine never applies; the Llama-family configs served here have none.
        model.train()
    if lora is not None and lora.dropout and trainable:
        model.train()  # the adapters' dropout acts in training mode only, with or without checkpointing
    model.to(device)
    if not dist.is_initialized():
        return policy
    _shard(base_of(policy), fsdp, device, value_head)
    return policy


def _shard(model, fsdp: FsdpSpec, device: torch.device, value_head: bool) -> None:
    """FSDP2 units: each decoder block (with its adapters), the value head, then the root."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    options = {}
    if device.type == "cuda" and fsdp.mixed_precision:
        options["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if fsdp.cpu_offload:
        options["offload_policy"] = CPUOffloadPolicy()
    for block in _decoder_blocks(model):
        fully_shard(block, **options)
    if value_head:
        # its own FSDP unit: it is called after the trunk's forward, outside the root's forward
        fully_shard(getattr(model, VALUE_HEAD), **options)
    fully_shard(model, **options)
    enable_fsdp_scoring(model)


def micro_batch_tokens(spec: RLJobSpec, model_path: str, device: torch.device) -> int:
    """The learner's micro-batch token budget: spec.learner.microBatchTokens, else the plan's default for this
    device (a GPU's own memory; on CPU the pod's memory from the spec), as `kuberl plan` prints it."""
    memory = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    if memory is None:
        memory = pod_memory(spec.learner.resources)
    return resolve_micro_batch_tokens(spec, read_model_shape(model_path), device.type == "cuda", memory)


def _decoder_blocks(model) -> list[torch.nn.Module]:
    blocks = getattr(getattr(model, "model", None), "layers", None)
    if blocks is None:
        raise ValueError(f"{type(model).__name__} has no model.layers: cannot shard it block by block")
    return list(blocks)
