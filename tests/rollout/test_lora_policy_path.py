"""The LoRA contract through KubeRL's own path: the learner's policy with adapters (`load_policy` with
spec.model.lora) is serialised to buckets (`policy_buckets`: the adapter tensors only), sent by the learner's
transport (`HttpBuckets`) to a rollout app's weight routes, and sampled through its `/v1/completions`. The log-probs
the server reports and the learner's of the same tokens give a mismatch KL of at most 1e-3 for each version, fp32
on CPU; above it when the learner scores without its adapters or the server samples the base model or an older
version.
"""

from __future__ import annotations

import pytest
import torch
from fastapi.testclient import TestClient
from helpers.tiny_job import tiny_job_spec

from kuberl.api.rljob import RLJob
from kuberl.api.spec import FsdpSpec, LoraSpec
from kuberl.tokens import bearer, new_token
from kuberl_rollout.server import RolloutSettings, build_app
from kuberl_trainer.algorithms.losses import k3
from kuberl_trainer.export import policy_buckets
from kuberl_trainer.policy import load_policy
from kuberl_trainer.token_scores import score_tokens
from kuberl_trainer.weight_transport import HttpBuckets
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
BOUND = 1e-3
LORA = {"rank": 8, "alpha": 16.0, "targetModules": ["all-linear"]}
TOKEN = new_token()
PROMPTS = [[5 + i, 100 + 7 * i, 200 + 3 * i, 7] for i in range(4)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(test client of a rollout app whose job trains LoRA adapters, the learner's policy)."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("lora-path")
    model = build_tiny_model(folder / "model", hidden_size=64, layers=2, seed=0)
    # a random head's near-uniform distributions hide a missing adapter: sharpen them as training would
    sharpened = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    sharpened.lm_head.weight.data *= 10
    sharpened.save_pretrained(model)
    spec = tiny_job_spec(model, training={"mode": "sync"})
    spec["model"]["lora"] = LORA
    job = RLJob.model_validate(
        {"apiVersion": "kuberl.io/v1alpha1", "kind": "RLJob", "metadata": {"name": "lora-path"}, "spec": spec}
    )
    policy = load_policy(str(model), FsdpSpec(), torch.device("cpu"), lora=LoraSpec.model_validate(LORA)).eval()
    settings = RolloutSettings(job, ["http://127.0.0.1:9"], "sandbox-token", TOKEN, model_path=str(model))
    with TestClient(build_app(settings), headers=bearer(TOKEN)) as client:
        yield client, policy


def train(policy, version: int) -> None:
    """Stand-in for a learner step: new random adapters, lora_B non-zero (PEFT starts it at zero)."""
    generator = torch.Generator().manual_seed(version)
    for name, parameter in policy.named_parameters():
        if "lora_B" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator)
        elif "lora_A" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5


def sample(client: TestClient, version: int) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt, sampled tokens, the server's log-probs) per prompt, at temperature 1, all of policy `version`."""
    out = []
    for i, prompt in enumerate(PROMPTS):
        body = {"model": "x", "prompt": prompt, "max_tokens": 16, "temperature": 1.0, "seed": 100 * version + i}
        answer = client.post("/v1/completions", json=body)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        assert set(choice["policy_versions"]) == {version}
        out.append((prompt, choice["token_ids"], choice["logprobs"]["token_logprobs"]))
    return out


def mismatch_kl(policy, samples) -> float:
    """The loss's mismatch KL (mean k3) of the server's log-probs against the learner's."""
    learner, rollout = [], []
    with torch.no_grad():
        for prompt, tokens, logprobs in samples:
            ids = torch.tensor([prompt + tokens])
            learner.append(score_tokens(policy, ids, None, len(prompt), 1.0, False, None)[0][0])
            rollout.append(torch.tensor(logprobs))
    return float(k3(torch.cat(learner), torch.cat(rollout)).mean())


def test_each_version_sent_by_the_learner_is_sampled_with_the_learners_log_probs(world):
    client, policy = world
    older = sample(client, 0)  # the base model: version 0 has no adapter
    for version in (1, 2):
        train(policy, version)
        buckets = policy_buckets(policy)
        assert all(b"lora_" in b and b"embed_tokens" not in b for b in buckets)  # the adapters, not the base
        HttpBuckets().send(client, version, buckets)
        assert client.get("/v1/policy").json()["version"] == version
        samples = sample(client, version)
        assert mismatch_kl(policy, samples) <= BOUND
        with policy.disable_adapter():
            assert mismatch_kl(policy, samples) > 10 * BOUND
        assert mismatch_kl(policy, older) > 10 * BOUND  # the base's or an older version's tokens are not its
        older = samples
