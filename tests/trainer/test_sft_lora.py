"""The supervised warm-up with spec.model.lora: only adapters train, and they are merged into a plain model
folder (no adapter files) in float32, which RL then adapts afresh."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import ADAPTER_CONFIG
from kuberl_trainer.sft import supervised_fit
from recipes.swe_toy.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("sft-lora") / "m", hidden_size=64, layers=2, seed=4)


def examples() -> list[tuple[list[int], list[int]]]:
    # one sequence to learn by heart: the loss on its masked half must fall
    tokens = [5, 17, 42, 99, 7, 256, 31, 8, 77, 12, 300, 64]
    return [(tokens, [0] * 6 + [1] * 6)]


def test_a_lora_warm_up_learns_and_saves_a_plain_model_with_the_adapters_merged(tiny, tmp_path):
    out = tmp_path / "warm"
    losses = supervised_fit(tiny, examples(), out, steps=60, learning_rate=1e-2, batch_size=1, lora=LoraSpec(rank=4))
    # the merged model scores the example as the trained adapters did, well below the base model
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokens, mask = examples()[0]
    labels = torch.tensor([[t if m else -100 for t, m in zip(tokens, mask, strict=True)]])
    with torch.no_grad():
        merged_loss = merged(input_ids=torch.tensor([tokens]), labels=labels).loss.item()
    assert merged_loss < losses[0] - 1.0 and abs(merged_loss - losses[-1]) < 0.1
    assert not (out / ADAPTER_CONFIG).exists()
    before, after = load_file(tiny / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after)
    assert all(t.dtype == torch.float32 for t in after.values())
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    # the adapted linear layers moved; the embedding and the norms (no adapters) did not
    assert any("q_proj" in name for name in changed) and any("down_proj" in name for name in changed)
    assert not any("embed_tokens" in name or "norm" in name for name in changed)


def test_without_lora_the_whole_model_trains(tiny, tmp_path):
    out = tmp_path / "full"
    supervised_fit(tiny, examples(), out, steps=3, learning_rate=1e-2, batch_size=1)
    before, after = load_file(tiny / "model.safetensors"), load_file(out / "model.safetensors")
    assert not torch.equal(before["model.embed_tokens.weight"], after["model.embed_tokens.weight"])


def test_micro_batches_take_the_same_steps_as_the_whole_batch(tiny, tmp_path):
    rows = [*examples(), ([9, 8, 7, 6, 5, 4, 3, 2], [0, 0, 0, 0, 1, 1, 1, 1]), ([11, 12, 13, 14], [0, 1, 1, 1])]
    whole = supervised_fit(tiny, rows, tmp_path / "whole", steps=3, learning_rate=1e-2, batch_size=4, seed=1)
    split = supervised_fit(
        tiny, rows, tmp_path / "split", steps=3, learning_rate=1e-2, batch_size=4, seed=1, micro_batch_tokens=12
    )
    assert split == pytest.approx(whole, rel=1e-4)
    a, b = load_file(tmp_path / "whole" / "model.safetensors"), load_file(tmp_path / "split" / "model.safetensors")
    assert all(torch.allclose(a[name], b[name], atol=1e-5) for name in a)
