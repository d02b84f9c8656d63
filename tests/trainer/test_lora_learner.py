"""The learner with LoRA (spec.model.lora): it trains the adapters only on a frozen base, sends and exports
only them (PEFT's names), its KL reference is its own base model, and a checkpoint of the adapters and their
optimizer state resumes exactly."""

from __future__ import annotations

import pytest
import torch
from helpers.fsdp_equivalence import global_batch
from peft import PeftModel
from safetensors.torch import load, load_file
from transformers import AutoModelForCausalLM

from kuberl.api.spec import FsdpSpec, LoraSpec
from kuberl.modeling.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_tensor_shapes
from kuberl_trainer.adapters import trainable_parameters
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.checkpoints.store import CheckpointStore
from kuberl_trainer.checkpoints.writer import Checkpointer, TrainingState
from kuberl_trainer.export import export_policy, policy_buckets
from kuberl_trainer.export import main as export_main
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import predict, train_step
from recipes.swe_toy.tiny_model import build_tiny_model

LORA = LoraSpec(rank=4, alpha=8)
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("lora") / "m", hidden_size=64, layers=2, seed=5)


def policy(tiny, seed: int = 0):
    torch.manual_seed(seed)  # lora_A's random initialisation
    model = load_policy(str(tiny), FsdpSpec(activation_checkpointing=False), CPU, lora=LORA)
    return model, torch.optim.AdamW(trainable_parameters(model), lr=1e-2)


def step(model, optimizer, batch, kl_coef: float = 0.0):
    config = LossConfig(off_policy="tis", kl_coef=kl_coef)
    return train_step(model, optimizer, batch, config, 1.0, 1, ref_model=model if kl_coef else None)


def test_a_step_trains_the_adapters_only_and_the_loss_falls(tiny):
    model, optimizer = policy(tiny)
    batch = global_batch(model.config.vocab_size)
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert adapters and all("lora_" in n for n in adapters)
    losses = [step(model, optimizer, batch).loss for _ in range(4)]
    assert losses[-1] < losses[0]
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in frozen.items())  # the base is bit-identical
    assert any(not torch.equal(after[n], p) for n, p in adapters.items())
    # the optimizer's state is the adapters' alone
    assert len(optimizer.state) == len(adapters) == len(adapter_tensor_shapes(tiny, LORA))


def test_the_reference_is_the_base_model_with_the_adapters_disabled(tiny):
    model, optimizer = policy(tiny)
    batch = global_batch(model.config.vocab_size)
    first = step(model, optimizer, batch, kl_coef=0.1)
    assert first.kl_ref == 0.0  # lora_B starts at zero: the initial policy is the base
    for _ in range(2):
        later = step(model, optimizer, batch, kl_coef=0.1)
    assert later.kl_ref > 0.0
    base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    with model.disable_adapter():
        disabled = predict(model, batch).logprobs
    assert torch.allclose(disabled, predict(base, batch).logprobs, atol=1e-6)
    assert not torch.allclose(predict(model, batch).logprobs, disabled, atol=1e-4)


def test_the_buckets_hold_the_adapters_under_peft_names(tiny):
    model, optimizer = policy(tiny)
    step(model, optimizer, global_batch(model.config.vocab_size))
    sent = {}
    for bucket in policy_buckets(model, bucket_bytes=4096):
        sent.update(load(bucket))
    assert {n: tuple(t.shape) for n, t in sent.items()} == adapter_tensor_shapes(tiny, LORA)
    assert all(t.dtype == torch.float32 for t in sent.values())
    trained = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
    assert all(torch.equal(sent[n], trained[n]) for n in sent)


def test_the_export_is_a_peft_folder_and_merges_into_the_same_model(tiny, tmp_path):
    model, optimizer = policy(tiny)
    batch = global_batch(model.config.vocab_size)
    for _ in range(3):
        step(model, optimizer, batch)
    folder = export_policy(model, tiny, tmp_path / "policy", lora=LORA, merged=True)
    assert (folder / ADAPTER_CONFIG).is_file() and not (folder / "model.safetensors").exists()
    assert load_file(folder / ADAPTER_WEIGHTS).keys() == adapter_tensor_shapes(tiny, LORA).keys()
    with torch.no_grad():
        expected = model(input_ids=batch.input_ids).logits
        base = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
        loaded = PeftModel.from_pretrained(base, folder)(input_ids=batch.input_ids).logits
        merged = AutoModelForCausalLM.from_pretrained(folder / "merged")(input_ids=batch.input_ids).logits
        export_main([str(folder), str(tiny), str(tmp_path / "by_hand")])  # python -m kuberl_trainer.export
        by_hand = AutoModelForCausalLM.from_pretrained(tmp_path / "by_hand")(input_ids=batch.input_ids).logits
    assert torch.allclose(loaded, expected, atol=1e-6)
    assert torch.allclose(merged, expected, atol=1e-5)
    assert (folder / "merged" / "tokenizer.json").is_file() and (folder / "merged" / "config.json").is_file()
    assert torch.equal(by_hand, merged)


def test_a_checkpoint_of_the_adapters_resumes_exactly(tiny, tmp_path):
    model, optimizer = policy(tiny)
    batch = global_batch(model.config.vocab_size)
    store = CheckpointStore(str(tmp_path / "checkpoints"))
    checkpointer = Checkpointer(store, tmp_path / "staging", keep=2)
    for _ in range(2):
        step(model, optimizer, batch)
    checkpointer.save(model, optimizer, TrainingState(step=2, policy_version=2))
    checkpointer.wait()
    uninterrupted = [step(model, optimizer, batch).loss for _ in range(3)]

    resumed, resumed_optimizer = policy(tiny, seed=123)  # other adapters: the checkpoint's must replace them
    state = Checkpointer(store, tmp_path / "staging2", keep=2).restore(resumed, resumed_optimizer)
    assert state is not None and state.step == 2
    assert [step(resumed, resumed_optimizer, batch).loss for _ in range(3)] == pytest.approx(uninterrupted, abs=1e-6)
    # the frozen base is not in the checkpoint: it is the model folder's
    stored = sum(int(meta["size"]) for meta in store.newest().files.values())
    assert stored < (tiny / "model.safetensors").stat().st_size / 2


def test_ppo_s_value_head_trains_in_full_and_is_never_sent(tiny):
    torch.manual_seed(0)
    model = load_policy(str(tiny), FsdpSpec(activation_checkpointing=False), CPU, value_head=True, lora=LORA)
    trained = {n for n, p in model.named_parameters() if p.requires_grad}
    heads = {n for n in trained if "value_head" in n}
    assert heads and all("lora_" in n for n in trained - heads)
    sent = {}
    for bucket in policy_buckets(model):
        sent.update(load(bucket))
    assert sent.keys() == adapter_tensor_shapes(tiny, LORA).keys()


def test_a_lora_policy_is_served_merged_by_the_commands_that_take_a_model_folder(tiny, tmp_path):
    """`kuberl evaluate JOB --model ADAPTER_DIR` (and the credit probes) serve a full folder: the adapters merged."""
    from kuberl.api.rljob import RLJob
    from kuberl_app.cli import _model_to_run

    model, optimizer = policy(tiny)
    batch = global_batch(model.config.vocab_size)
    step(model, optimizer, batch)
    folder = export_policy(model, tiny, tmp_path / "policy", lora=LORA)
    job = RLJob.from_manifest(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "lora"},
            "spec": {"model": {"uri": str(tiny), "lora": {"rank": 4, "alpha": 8}}},
        }
    )
    served = _model_to_run(job, str(folder))
    assert served == str(folder / "merged")
    with torch.no_grad():
        expected = model(input_ids=batch.input_ids).logits
        merged = AutoModelForCausalLM.from_pretrained(served)(input_ids=batch.input_ids).logits
    assert torch.allclose(merged, expected, atol=1e-5)
    assert _model_to_run(job, str(folder)) == served  # merged once
