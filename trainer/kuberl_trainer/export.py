"""A consolidated safetensors export of the (sharded) policy: what rollout servers load or receive.

With LoRA the policy is its adapters: they are what is sent (PEFT's tensor names) and exported (a PEFT adapter
folder, loadable with `PeftModel.from_pretrained` on the base); `merge_adapter` turns such a folder into a full
model folder on request (`python -m kuberl_trainer.export ADAPTER_DIR BASE_MODEL_DIR TARGET`).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
import torch.distributed as dist

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_config_json
from kuberl_trainer.adapters import adapter_tensors, has_adapters
from kuberl_trainer.value_head import is_value_head_weight


def served_tensors(model) -> dict[str, torch.Tensor]:
    """The full policy on CPU under Hugging Face names, as served (every rank must call this when sharded).
    The value head is left out, and a tied lm_head too (safetensors refuses shared storage; HF re-ties).
    With LoRA: the adapter tensors only, under PEFT's names (the rollout tier has the base)."""
    if has_adapters(model):
        return adapter_tensors(model)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(model, options=options) if dist.is_initialized() else model.state_dict()
    tensors = {n: t.detach().to("cpu").contiguous() for n, t in state.items() if not is_value_head_weight(n)}
    if getattr(model.config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    return tensors


def export_policy(
    model,
    source_model_dir: str | Path,
    target: str | Path,
    rank: int = 0,
    lora: LoraSpec | None = None,
    merged: bool = False,
) -> Path | None:
    """Gather the full state dict (every rank must call this) and, on rank 0, write a Hugging Face folder:
    `model.safetensors`, the config and the tokenizer of `source_model_dir`; with adapters (`lora`, the job's
    spec.model.lora) a PEFT adapter folder on that base instead, and with `merged` also the merged model in
    `target/merged`. Returns the folder on rank 0."""
    from safetensors.torch import save_file

    tensors = served_tensors(model)
    if rank != 0:
        return None
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    if has_adapters(model):
        if lora is None:
            raise ValueError("a policy with LoRA adapters is exported with its LoraSpec")
        save_file(tensors, target / ADAPTER_WEIGHTS, metadata={"format": "pt"})
        config = adapter_config_json(lora, str(source_model_dir))
        (target / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
        _copy_tokenizer(source_model_dir, target)
        if merged:
            merge_adapter(target, source_model_dir, target / MERGED_DIR)
        return target
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    for item in Path(source_model_dir).iterdir():
        if item.suffix != ".safetensors" and item.name != "model.safetensors.index.json" and item.is_file():
            shutil.copy2(item, target / item.name)
    return target


MERGED_DIR = "merged"


def merge_adapter(adapter_dir: str | Path, base_model_dir: str | Path, target: str | Path) -> Path:
    """A full model folder (float32) of the base with the adapters of `adapter_dir` merged into its weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    target = Path(target)
    merged.save_pretrained(target)
    _copy_tokenizer(base_model_dir, target)
    return target


def _copy_tokenizer(source_model_dir: str | Path, target: Path) -> None:
    for item in Path(source_model_dir).iterdir():
        if item.is_file() and ("token" in item.name or item.name == "chat_template.jinja"):
            shutil.copy2(item, target / item.name)


BUCKET_BYTES = 512 * 2**20
"""Largest bucket of a weight upload: a server holds one request body of at most this (plus one tensor larger
than it, alone in its bucket) while the next arrives."""


def policy_buckets(model, bucket_bytes: int = BUCKET_BYTES) -> list[bytes]:
    """The full policy as safetensors blobs of about `bucket_bytes` each (Hugging Face names, in state-dict
    order), the buckets of a rollout server's weight upload."""
    from safetensors.torch import save

    groups: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in served_tensors(model).items():
        nbytes = tensor.numel() * tensor.element_size()
        if groups[-1] and size + nbytes > bucket_bytes:
            groups.append({})
            size = 0
        groups[-1][name] = tensor
        size += nbytes
    return [save(group) for group in groups]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Merge an exported LoRA adapter into its base model (float32).")
    parser.add_argument("adapter_dir")
    parser.add_argument("base_model_dir")
    parser.add_argument("target")
    args = parser.parse_args(argv)
    print(merge_adapter(args.adapter_dir, args.base_model_dir, args.target))


if __name__ == "__main__":
    main()
