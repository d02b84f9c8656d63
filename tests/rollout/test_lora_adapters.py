"""LoRA RL on the rollout tier (spec.model.lora): vLLM serves each policy version as a new adapter on the frozen
base weights, never merged. The learner sends only the adapter tensors (bucket uploads or a stored version);
each becomes the version new requests use, requests in flight finish on the adapter they started with, and
old adapters are unloaded (their folders deleted) once no request needs them.

A real vLLM CPU engine on a tiny Llama, inside one rollout app (its HTTP routes through a test client). Tests
run in file order: each update must be newer than the last."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from fastapi.testclient import TestClient
from helpers.tiny_job import tiny_job_spec
from safetensors.torch import save

from kuberl.api.rljob import RLJob
from kuberl.api.spec import LoraSpec
from kuberl.modeling.lora import adapter_tensor_shapes
from kuberl.tokens import bearer, new_token
from kuberl_rollout.adapters import lora_engine_arguments
from kuberl_rollout.server import RolloutSettings, build_app, engine_config
from recipes.swe_toy.tiny_model import build_tiny_model

TOKEN = new_token()
LORA = {"rank": 8, "alpha": 16.0, "targetModules": ["all-linear"]}
PROMPT = [5, 6, 7, 8, 9]


def rl_job(model: Path, **sections) -> RLJob:
    spec = tiny_job_spec(model, **sections)
    spec["model"]["lora"] = LORA
    return RLJob.model_validate(
        {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "lora"}, "spec": spec}
    )


def test_vllm_gets_an_allowed_rank_and_a_slot_for_every_version_a_request_may_use(tmp_path):
    assert lora_engine_arguments(LoraSpec(rank=8), 0) == {
        "enable_lora": True,
        "max_lora_rank": 8,
        "max_loras": 2,
        "max_cpu_loras": 2,
    }
    assert lora_engine_arguments(LoraSpec(rank=9), 3)["max_lora_rank"] == 16  # vLLM allows 1, 8, 16, 32, ...
    assert lora_engine_arguments(LoraSpec(rank=9), 3)["max_loras"] == 5
    with pytest.raises(ValueError, match="rank 600"):
        lora_engine_arguments(LoraSpec(rank=600), 0)
    sync = engine_config(rl_job(tmp_path, training={"mode": "sync", "maxStaleness": 4}), str(tmp_path))
    stale = engine_config(rl_job(tmp_path, training={"mode": "async", "maxStaleness": 2}), str(tmp_path))
    assert (sync.max_staleness, stale.max_staleness) == (0, 2)
    assert sync.lora == LoraSpec(**{"rank": 8, "alpha": 16.0})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """(test client, engine, model folder) of a rollout app whose job trains LoRA adapters, async, maxStaleness 1."""
    folder = tmp_path_factory.mktemp("lora")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=3)
    job = rl_job(model, training={"mode": "async", "maxStaleness": 1})
    settings = RolloutSettings(job, ["http://127.0.0.1:9"], "sandbox-token", TOKEN, model_path=str(model))
    with TestClient(build_app(settings), headers=bearer(TOKEN)) as client:
        yield client, client.app.state.rollout.service.agent.engine, model


def adapter(model: Path, version: int, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Random adapter tensors of the job's shapes; lora_B non-zero, so the policy differs from the base."""
    gen = torch.Generator().manual_seed(version)
    shapes = adapter_tensor_shapes(model, LoraSpec(**{"rank": 8, "alpha": 16.0}))
    return {name: torch.randn(shape, generator=gen) * scale for name, shape in shapes.items()}


def upload(client: TestClient, version: int, tensors: dict[str, torch.Tensor]):
    return client.put(f"/v1/weights/{version}/buckets/0", params={"of": 1}, content=save(tensors))


def complete(client: TestClient, max_tokens: int = 12) -> dict:
    body = {"model": "x", "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0}
    answer = client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]


@pytest.mark.slow
def test_an_adapter_upload_becomes_the_current_version_and_changes_what_is_sampled(server):
    client, engine, model = server
    lora = engine.llm.vllm_config.lora_config  # the engine runs with LoRA: rank 8, maxStaleness 1 -> 3 slots
    assert (lora.max_lora_rank, lora.max_loras, lora.max_cpu_loras) == (8, 3, 3)
    base = complete(client)
    assert set(base["policy_versions"]) == {0} and engine.adapters.registered == []
    receipt = upload(client, 1, adapter(model, 1))
    assert receipt.status_code == 202 and receipt.json()["applied"], receipt.text
    assert client.get("/v1/policy").json()["version"] == 1
    assert client.get("/v1/models").json()["data"][0]["policy_version"] == 1
    tuned = complete(client)
    assert set(tuned["policy_versions"]) == {1}
    assert tuned["token_ids"] != base["token_ids"]
    chat = client.post(
        "/v1/chat/completions", json={"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    )
    assert chat.status_code == 200 and set(chat.json()["choices"][0]["policy_versions"]) == {1}, chat.text
    assert engine.adapters.registered == [1]


@pytest.mark.slow
def test_a_request_in_flight_during_updates_finishes_on_its_adapter_which_is_unloaded_after(server):
    client, engine, model = server
    version = engine.version
    # forced long (min_tokens): it is still sampling when the next two versions arrive
    running = client.portal.start_task_soon(engine.generate, PROMPT, 800, 1.0, 1.0, None, 0, 800)
    while engine.adapters.adapters[version].users == 0:
        time.sleep(0.01)
    for newer in (version + 1, version + 2):
        assert upload(client, newer, adapter(model, newer)).json()["applied"]
    assert not running.done(), "the request ended before the updates: the test proves nothing"
    # older than the 2 kept (maxStaleness + 1), but in use: still registered
    assert engine.adapters.registered == [version, version + 1, version + 2]
    assert set(complete(client)["policy_versions"]) == {version + 2}
    generation = running.result(timeout=300)
    assert len(generation.token_ids) == 800 and set(generation.versions) == {version}
    folder = engine.adapters.root / f"policy-v{version}"
    for _ in range(100):  # unloaded by a task the request's end started
        if version not in engine.adapters.registered and not folder.exists():
            break
        time.sleep(0.05)
    assert engine.adapters.registered == [version + 1, version + 2] and not folder.exists()
    assert len(client.portal.call(engine.llm.list_loras)) == 2


@pytest.mark.slow
def test_a_tensor_of_another_name_or_shape_is_refused_naming_it(server):
    client, engine, model = server
    tensors = adapter(model, 50)
    name = next(iter(tensors))
    wrong_shape = {**tensors, name: torch.zeros(3, 3)}
    refused = upload(client, engine.version + 1, wrong_shape)
    assert refused.status_code == 400 and name in refused.json()["detail"] and "[3, 3]" in refused.json()["detail"]
    unknown = {**tensors, "base_model.model.model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64)}
    refused = upload(client, engine.version + 1, unknown)
    assert refused.status_code == 400 and "self_attn.q_proj.weight" in refused.json()["detail"]
    missing = dict(list(tensors.items())[1:])
    refused = upload(client, engine.version + 1, missing)
    assert refused.status_code == 400 and "lacks 1" in refused.json()["detail"]


@pytest.mark.slow
def test_a_stored_adapter_version_is_loaded_from_storage(server, tmp_path):
    client, engine, model = server
    version = engine.version + 1
    (tmp_path / "model-00001-of-00001.safetensors").write_bytes(save(adapter(model, version)))
    loaded = client.post("/v1/weights/load", json={"uri": str(tmp_path), "version": version})
    assert loaded.status_code == 200 and loaded.json() == {"version": version, "applied": True}, loaded.text
    assert set(complete(client)["policy_versions"]) == {version}
    assert engine.adapters.current.version == version


@pytest.mark.slow
def test_old_adapters_are_unloaded_and_their_folders_deleted(server):
    client, engine, model = server
    first = engine.version + 1
    for version in range(first, first + 10):
        assert upload(client, version, adapter(model, version)).json()["applied"]
        complete(client, max_tokens=2)
    kept = 1 + 2  # maxStaleness + 2
    registered = client.portal.call(engine.llm.list_loras)
    assert len(registered) <= kept and len(engine.adapters.registered) <= kept
    assert first + 9 in engine.adapters.registered
    folders = [p for p in engine.adapters.root.iterdir()]
    assert len(folders) == len(engine.adapters.registered), folders
