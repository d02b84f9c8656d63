"""Micro-batches packed by a token budget and log-probs computed in chunks change the cost of a step, never its
result: the same log-probs, loss and gradient (within float32 tolerance) as one forward over the whole batch,
for token-mean and seq-mean, with and without masked importance sampling, mini-batches, a reference policy."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import BIN

from kuberl.api.spec import FsdpSpec
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.policy import load_policy
from kuberl_trainer.step import TokenBatch, forward, micro_batches, pack_by_tokens, predict, train_step
from recipes.swe_toy.tiny_model import build_tiny_model

NO_AC = FsdpSpec(activation_checkpointing=False)
LENGTHS = (40, 12, 33, 25, 40, 8)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("micro") / "m", hidden_size=64, layers=2, seed=3)


def ragged_batch(vocab: int, lengths=LENGTHS) -> TokenBatch:
    """Right-padded rows of different lengths; the loss reads each row's second half."""
    g = torch.Generator().manual_seed(4)
    rows, width = len(lengths), max(lengths)
    ids = torch.randint(5, vocab, (rows, width), generator=g)
    attention = torch.zeros(rows, width, dtype=torch.long)
    mask = torch.zeros(rows, width, dtype=torch.bool)
    for r, n in enumerate(lengths):
        attention[r, :n] = 1
        mask[r, n // 2 : n] = True
        ids[r, n:] = 0
    rollout = -6.0 + 0.5 * torch.randn(rows, width, generator=g)
    advantages = torch.linspace(-1, 1, rows)[:, None].expand(rows, width).clone()
    return TokenBatch(ids, attention, mask, rollout, advantages)


def gradients(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def reference_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """The plain computation: every logit of the batch at once."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_chunked_log_probs_and_gradients_match_the_whole_logits(model_dir, checkpointing):
    model = load_policy(str(model_dir), FsdpSpec(activation_checkpointing=checkpointing), torch.device("cpu"))
    b = ragged_batch(model.config.vocab_size, lengths=(40,) * 4)
    whole = copy.deepcopy(model)
    expected = reference_logprobs(whole, b.input_ids)
    (expected * b.loss_mask).sum().backward()
    for chunk in (1, 7, 64, 10_000):  # chunks of a few positions, uneven ones, one chunk
        m = copy.deepcopy(model)
        out = forward(m, b.input_ids, b.attention_mask, chunk_tokens=chunk)
        assert out.logprobs.allclose(expected, atol=1e-5)
        (out.logprobs * b.loss_mask).sum().backward()
        assert gradients(m).allclose(gradients(whole), atol=1e-5)
    with torch.no_grad():
        assert predict(model, b, chunk_tokens=5).logprobs.allclose(expected, atol=1e-5)


def test_values_come_from_the_final_hidden_state(model_dir):
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"), value_head=True)
    torch.nn.init.normal_(model.value_head.weight)
    b = ragged_batch(model.config.vocab_size, lengths=(30,) * 3)
    with torch.no_grad():
        hidden = model(input_ids=b.input_ids, output_hidden_states=True).hidden_states[-1]
        expected = model.value_head(hidden).squeeze(-1)
        assert predict(model, b, chunk_tokens=4).values.allclose(expected, atol=1e-5)


def test_rows_are_packed_longest_first_within_the_budget():
    assert pack_by_tokens([10, 30, 20, 30], 60) == [[1, 3], [2, 0]]  # 2 x 30, then 20 + 10 padded to 2 x 20
    assert pack_by_tokens([10, 30, 20], None) == [[1, 2, 0]]  # no budget: one micro-batch
    # a row longer than the budget is a micro-batch of its own; the rest still share
    assert pack_by_tokens([100, 5, 5, 5], 12) == [[0], [1, 2], [3]]
    for group in pack_by_tokens(list(LENGTHS), 64):
        assert len(group) * max(LENGTHS[i] for i in group) <= 64 or len(group) == 1


def test_rows_without_a_loss_token_are_not_trained_and_one_micro_batch_always_runs(model_dir):
    b = ragged_batch(2048)
    b.loss_mask[1:] = False
    assert [m.tolist() for m in micro_batches(b, 64)] == [[0]]
    b.loss_mask[:] = False
    assert micro_batches(b, 64) == [None]  # an idle micro-batch keeps FSDP's collectives in step


CASES = {
    "token-mean tis": (LossConfig(off_policy="tis"), 1),
    "seq-mean tis": (LossConfig(off_policy="tis", aggregation="seq-mean"), 1),
    "token-mean mis": (LossConfig(off_policy="mis", cap=1.5), 1),
    "seq-mean mis, mini-batches": (LossConfig(off_policy="mis", cap=1.5, aggregation="seq-mean"), 2),
    "entropy and kl": (LossConfig(entropy_coef=0.01, kl_coef=0.1), 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_packing_by_tokens_gives_the_loss_and_gradient_of_one_micro_batch(model_dir, case):
    config, mini = CASES[case]
    model = load_policy(str(model_dir), NO_AC, torch.device("cpu"))
    reference = load_policy(str(model_dir), NO_AC, torch.device("cpu"), trainable=False)
    with torch.no_grad():  # rollout log-probs near the policy's: mis keeps some tokens and drops others
        near = predict(model, ragged_batch(model.config.vocab_size)).logprobs
    reports, grads = [], []
    for budget, chunk in ((None, None), (64, 16), (1, 3)):  # whole, a few rows each, one row each
        m = copy.deepcopy(model)
        optimizer = torch.optim.SGD(m.parameters(), lr=0.0)  # the gradient stays for the comparison
        b = ragged_batch(m.config.vocab_size)
        b.rollout_logprobs = near + 0.3 * torch.randn(near.shape, generator=torch.Generator().manual_seed(9))
        reports.append(
            train_step(m, optimizer, b, config, 1e9, 1, mini, reference, micro_batch_tokens=budget, chunk_tokens=chunk)
        )
        grads.append(gradients(m))
    for report, grad in zip(reports[1:], grads[1:], strict=True):
        assert report.loss == pytest.approx(reports[0].loss, rel=1e-5, abs=1e-7)
        for key in ("mismatch_kl", "clip_fraction", "is_weight_mean", "entropy", "kl_ref"):
            assert getattr(report, key) == pytest.approx(getattr(reports[0], key), rel=1e-5, abs=1e-7)
        assert report.tokens == reports[0].tokens
        assert grad.allclose(grads[0], rtol=1e-4, atol=1e-6)
    assert grads[0].abs().sum() > 0


@pytest.mark.slow
def test_several_ranks_with_different_micro_batch_counts_train_like_one(model_dir, tmp_path):
    """2 FSDP ranks whose rows pack into different numbers of micro-batches (one idles through the
    difference) give the loss trajectory of 1 process with one micro-batch."""
    script = Path(__file__).with_name("fsdp_micro_batch_run.py")

    def run(world: int, budget: int) -> list[float]:
        out = tmp_path / f"w{world}-{budget}.json"
        argv = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(world), str(script)]
        result = subprocess.run(
            [*argv, str(model_dir), str(out), str(budget)], capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(out.read_text())["losses"]

    one, two = run(1, 0), run(2, 40)
    assert len(one) == 3 and one[0] != one[-1]
    assert two == pytest.approx(one, abs=1e-5)


def test_the_learner_takes_the_budget_the_plan_prints(model_dir):
    from kuberl.api.spec import RLJobSpec
    from kuberl.planning import plan_learner, read_model_shape
    from kuberl_trainer.policy import micro_batch_tokens

    doc = {
        "model": {"uri": str(model_dir), "maxContextTokens": 1024},
        "environment": {"maxTokensPerTrajectory": 1024},
        "algorithm": {"groupSize": 2},
        "training": {"trajectoriesPerStep": 512},
        "learner": {"resources": {"limits": {"memory": "2Gi"}}},
    }
    spec = RLJobSpec.model_validate(doc)
    default = micro_batch_tokens(spec, str(model_dir), torch.device("cpu"))
    assert default == plan_learner(spec, read_model_shape(str(model_dir))).token_budget > 1024
    doc["learner"]["microBatchTokens"] = 4096
    assert micro_batch_tokens(RLJobSpec.model_validate(doc), str(model_dir), torch.device("cpu")) == 4096
