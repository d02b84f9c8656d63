"""Copy pretraining gives a random tiny model an induction head: it copies a sequence it has seen."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoTokenizer

from recipes.swe_toy.copy_pretraining import (
    RECORD,
    CopyStage,
    copy_accuracy,
    copy_batch,
    pretrain_copying,
    token_ranking,
)
from recipes.swe_toy.tiny_model import build_tiny_model


def test_the_batch_is_a_sequence_and_its_repeat_with_loss_only_where_the_repeat_is_predictable():
    ids, labels = copy_batch(torch.Generator().manual_seed(0), batch_size=3, length=5, tokens=torch.arange(6, 16))
    assert ids.shape == labels.shape == (3, 10)
    assert torch.equal(ids[:, :5], ids[:, 5:]) and int(ids.min()) >= 6 and int(ids.max()) < 16
    assert (labels[:, :6] == -100).all() and torch.equal(labels[:, 6:], ids[:, 6:])


@pytest.mark.slow
def test_a_short_curriculum_teaches_a_random_model_to_copy(tmp_path):
    path = build_tiny_model(tmp_path / "m", hidden_size=128, layers=2, heads=4, seed=7)
    model = lambda: __import__("transformers").AutoModelForCausalLM.from_pretrained(path)  # noqa: E731
    tokens = torch.tensor(token_ranking(path, AutoTokenizer.from_pretrained(path))[:128])  # what stage 1 draws from
    probe, _ = copy_batch(torch.Generator().manual_seed(123), batch_size=8, length=24, tokens=tokens)
    before = copy_accuracy(model(), probe, 24)
    seen = []
    curriculum = (CopyStage(steps=800, vocabulary=128, min_length=8, max_length=40, learning_rate=1e-3, batch_size=32),)
    accuracies = pretrain_copying(path, curriculum, seed=0, on_progress=lambda *args: seen.append(args))
    after = copy_accuracy(model(), probe, 24)  # sequences it never trained on
    assert before < 0.1 and after > 0.8 and accuracies[0] > 0.9, (before, after, accuracies)
    assert seen[-1][:2] == (0, 800)
    assert json.loads((path / RECORD).read_text())["accuracies"] == accuracies
