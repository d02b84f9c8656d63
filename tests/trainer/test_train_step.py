"""The train step's options on a tiny real model: mini-batches (PPO-style updates against the batch's
starting log-probs), the value head and its loss, the KL to a frozen reference, entropy, the shard
padding that keeps FSDP ranks in step, and the non-finite guard."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.export import policy_buckets, served_tensors
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, first_scored, forward, predict, train_step
from kuberl_trainer.value_head import has_value_head
from recipes.swe_toy.tiny_model import build_tiny_model

NO_AC = FsdpSpec(activation_checkpointing=False)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("step") / "m", hidden_size=64, layers=2, seed=8)


def batch(vocab: int, rows: int = 4, length: int = 24, value_targets: bool = False) -> TokenBatch:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, vocab, (rows, length), generator=g)
    mask = torch.zeros(rows, length, dtype=torch.bool)
    mask[:, 10:] = True
    advantages = torch.linspace(-1, 1, rows)[:, None].expand(rows, length).clone()
    out = TokenBatch(ids, torch.ones_like(ids), mask, torch.full((rows, length), -6.0), advantages)
    if value_targets:
        out.returns = torch.ones(rows, length)
        out.value_mask = mask.clone()
    return out


def test_mini_batches_take_several_clipped_updates(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    b = batch(model.config.vocab_size)
    before = copy.deepcopy(model.state_dict())
    report = train_step(model, optimizer, b, LossConfig(off_policy="none"), 1.0, 1, mini_batches=2)
    assert optimizer.state[next(iter(model.parameters()))]["step"] == 2  # two optimizer updates
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    # the second mini-batch is measured against the log-probs of the batch's start: the ratio moved
    assert report.tokens == float(b.loss_mask.sum()) and report.skipped == 0


def test_value_head_learns_its_targets_and_is_not_served(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"), value_head=True)
    assert has_value_head(model)
    b = batch(model.config.vocab_size, value_targets=True)
    assert predict(model, b).values.abs().max() == 0  # zero-initialised: GAE starts from plain returns
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = [train_step(model, optimizer, b, LossConfig(), 1.0, 1, value_coef=1.0).value_loss for _ in range(8)]
    assert losses[0] == pytest.approx(1.0) and losses[-1] < 0.5 * losses[0]  # V moves towards the returns
    assert not any(name.startswith("value_head") for name in served_tensors(model))


def test_kl_to_the_frozen_reference_grows_as_the_policy_moves(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    reference = load_policy(str(model_dir), NO_AC, torch.device("cpu"), trainable=False)
    assert not any(p.requires_grad for p in reference.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    b = batch(model.config.vocab_size)
    config = LossConfig(kl_coef=0.1, entropy_coef=0.01)
    kls = [train_step(model, optimizer, b, config, 1.0, 1, ref_model=reference).kl_ref for _ in range(3)]
    assert kls[0] == pytest.approx(0.0, abs=1e-7) and kls[2] > kls[1] > 0
    ref_state = reference.state_dict()
    fresh = load_policy(str(model_dir), NO_AC, torch.device("cpu"), trainable=False).state_dict()
    assert all(torch.equal(ref_state[k], fresh[k]) for k in fresh)  # the reference never trains


def test_entropy_is_reported_in_nats(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    report = train_step(model, optimizer, batch(model.config.vocab_size), LossConfig(), 1.0, 1)
    vocab = model.config.vocab_size
    assert 0 < report.entropy <= torch.log(torch.tensor(float(vocab))).item() + 1e-4  # a random model: near log V


def test_a_non_finite_loss_skips_the_update(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    b = batch(model.config.vocab_size)
    b.advantages[0, 12] = float("nan")
    before = copy.deepcopy(model.state_dict())
    report = train_step(model, optimizer, b, LossConfig(), 1.0, 1)
    assert report.skipped == 1.0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_log_probs_are_of_the_tempered_distribution_the_engine_sampled(model_dir):
    """At rollout temperature T the engine reports log-probs of softmax(logits / T); the learner scores the
    same distribution, so the mismatch KL is that of the numerics, not of the temperature."""
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    b = batch(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=b.input_ids).logits[:, :-1].float() / 0.7
        sampled = torch.log_softmax(logits, -1).gather(-1, b.input_ids[:, 1:, None])[..., 0]
    b.rollout_logprobs = torch.cat([torch.zeros_like(sampled[:, :1]), sampled], dim=1)
    tempered = train_step(model, optimizer, b, LossConfig(temperature=0.7), 1.0, 1)
    untempered = train_step(model, optimizer, b, LossConfig(), 1.0, 1)
    assert tempered.mismatch_kl < 1e-6
    assert untempered.mismatch_kl > 1e-3
    assert predict(model, b, 0.7).logprobs[:, 1:].allclose(b.rollout_logprobs[:, 1:], atol=1e-5)


def test_log_probs_start_where_the_loss_first_reads_and_match_a_full_forward(model_dir):
    """The logits of the prompt nobody trains on are never computed; from the first scored token on the
    log-probs and entropies are those of a full forward, and a step computes the same loss and gradient."""
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    b = batch(model.config.vocab_size)
    b.loss_mask[0, 10:12] = False  # rows start at different positions: the earliest one counts
    assert first_scored(b.loss_mask) == 10 and first_scored(torch.zeros_like(b.loss_mask)) == 1
    full, cut = predict(model, b), predict(model, b, from_position=10)
    assert cut.logprobs.shape == full.logprobs.shape == b.input_ids.shape
    assert (cut.logprobs[:, :10] == 0).all() and (cut.entropy[:, :10] == 0).all()
    assert cut.logprobs[:, 10:].allclose(full.logprobs[:, 10:], atol=1e-6)
    assert cut.entropy[:, 10:].allclose(full.entropy[:, 10:], atol=1e-6)
    assert predict(model, b, from_position=999).logprobs.abs().sum() == 0  # past the end: nothing scored

    grads = []
    for start in (1, 10):
        m = copy.deepcopy(model)
        out = forward(m, b.input_ids, b.attention_mask, from_position=start)
        (out.logprobs * b.loss_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert grads[1].allclose(grads[0], atol=1e-6)


def test_activation_checkpointing_recomputes_in_the_learner(model_dir):
    """Hugging Face checkpoints only in training mode; from_pretrained hands out eval mode."""
    model = load_policy(str(model_dir), FsdpSpec(activation_checkpointing=True), torch.device("cpu"))
    assert model.training and model.is_gradient_checkpointing
    assert not load_policy(str(model_dir), NO_AC, torch.device("cpu")).is_gradient_checkpointing
    b = batch(model.config.vocab_size)
    reference = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    grads = []
    for m in (model, reference):  # recomputation changes the cost, never the gradient
        out = forward(m, b.input_ids, b.attention_mask)
        (out.logprobs * b.loss_mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    assert grads[0].allclose(grads[1], atol=1e-6)


def test_the_policy_is_published_in_buckets_that_the_server_takes_as_they_are(model_dir, tmp_path):
    from safetensors.torch import load

    from kuberl_rollout.weights import BucketAssembler, chunks_of, expected_tensors

    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    tensors = served_tensors(model)
    largest = max(t.numel() * t.element_size() for t in tensors.values())
    buckets = policy_buckets(model, bucket_bytes=largest)
    assert len(buckets) > 2  # several buckets, none holding more than one bucket's worth but a lone big tensor
    decoded = [load(b) for b in buckets]
    assert all(sum(t.numel() * t.element_size() for t in d.values()) <= largest for d in decoded)
    merged = {name: t for d in decoded for name, t in d.items()}
    assert merged.keys() == tensors.keys() and all(torch.equal(merged[n], tensors[n]) for n in tensors)
    assembler = BucketAssembler(expected_tensors(model_dir), staging=tmp_path)
    staged = [asyncio.run(assembler.stage(1, i, len(buckets), chunks_of(b, 4096), 0)) for i, b in enumerate(buckets)]
    assert staged == [False] * (len(buckets) - 1) + [True]
    assert [f.read_bytes() for f in assembler.take()] == buckets
    assert len(policy_buckets(model)) == 1  # the default (512 MiB) holds a tiny model whole
