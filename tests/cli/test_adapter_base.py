"""An exported LoRA policy is merged into the model it was trained on: after a warm-up that is the warmed-up
model its adapter_config.json names, not spec.model.uri."""

from __future__ import annotations

import json

from kuberl.api.rljob import RLJob
from kuberl_app.cli import _adapter_base


def job(uri: str) -> RLJob:
    return RLJob.model_validate(
        {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "j"},
            "spec": {"model": {"uri": uri}},
        }
    )


def adapter(tmp_path, base: str):
    config = tmp_path / "adapter_config.json"
    config.write_text(json.dumps({"base_model_name_or_path": base, "r": 4}))
    return config


def model_folder(path):
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_the_base_the_adapter_names_wins_when_it_is_here(tmp_path):
    warmed = model_folder(tmp_path / "warmup" / "model")
    original = model_folder(tmp_path / "original")
    assert _adapter_base(adapter(tmp_path, str(warmed)), job(str(original))) == str(warmed)


def test_a_base_that_is_not_here_falls_back_to_the_jobs_model(tmp_path, capsys):
    original = model_folder(tmp_path / "original")
    base = _adapter_base(adapter(tmp_path, "/cache/elsewhere"), job(str(original)))
    assert base == str(original)
    assert "/cache/elsewhere" in capsys.readouterr().out
