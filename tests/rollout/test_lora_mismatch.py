"""The LoRA contract between the two sides of training: tokens that vLLM sampled through a LoRA adapter have, under
the learner's PEFT model with the same adapter, the log-probs vLLM reported. The mismatch KL (the k3 estimator
the loss reports) stays at most 1e-3 for every policy version, fp32 on CPU; it is well above 1e-3 when the
adapter is missing on either side, so these tests fail when one side silently serves or scores the base model.

One vLLM engine (offline `LLM` with the rollout engine's arguments and LoRA enabled) serves the module; each
policy version is a PEFT adapter folder with random, non-zero lora_B, loaded as a new LoRA request.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kuberl.api.spec import EngineSpec
from kuberl_rollout.engine import EngineConfig, engine_arguments
from kuberl_trainer.algorithms.losses import k3
from kuberl_trainer.token_scores import score_tokens
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
BOUND = 1e-3
"""The contract: mismatch KL per step at most this."""
RANK, ALPHA = 8, 16.0
VERSIONS = (1, 2)
PROMPTS = [[5 + i, 100 + 7 * i, 200 + 3 * i, 7] for i in range(4)]
NEW_TOKENS = 24


@dataclass(frozen=True)
class Sample:
    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]
    """What vLLM reported for each sampled token (processed log-probs, temperature 1)."""


def _adapter(model, folder: Path, seed: int) -> Path:
    """Give `model`'s LoRA layers a random lora_B (PEFT starts it at zero: the adapter would be a no-op and the test
    vacuous), scaled so the adapted policy is far from the base; save it as a PEFT folder."""
    generator = torch.Generator().manual_seed(seed)
    for name, parameter in model.named_parameters():
        if "lora_B" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator)
        elif "lora_A" in name:
            parameter.data = torch.randn(parameter.shape, generator=generator) / parameter.shape[1] ** 0.5
    model.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """(base folder, the PEFT model, {version: adapter folder}); the model holds the last version's weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = tmp_path_factory.mktemp("lora")
    base = build_tiny_model(folder / "base", hidden_size=64, layers=2, heads=2, seed=0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    # a random head gives logits of std ~0.2, near-uniform next-token distributions that no hidden-state change
    # moves far: sharpen them as training would, so a missing adapter shows as a KL far above the bound
    model.lm_head.weight.data *= 10
    model.save_pretrained(base)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0, target_modules="all-linear")
    peft_model = get_peft_model(model, config).eval()
    adapters = {v: _adapter(peft_model, folder / f"policy-{v}", seed=v) for v in VERSIONS}
    return base, peft_model, adapters


def _flask_proxies_bound() -> contextlib.AbstractContextManager:
    """vLLM's CPU kernel registration calls hasattr on every global of every imported module, and flask's
    context proxies (`flask.request`, ...) raise RuntimeError outside a request. Another test file in the same
    pytest worker may have imported flask (moto's S3 server does): give the proxies a request to resolve to."""
    flask = sys.modules.get("flask")
    return flask.Flask("vllm-in-process").test_request_context() if flask else contextlib.nullcontext()


@pytest.fixture(scope="module")
def llm(policy):
    """vLLM with the rollout engine's arguments (fp32, processed log-probs) and LoRA enabled."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM

    arguments = engine_arguments(EngineConfig(str(policy[0]), EngineSpec(max_num_seqs=8), max_model_len=512))
    with _flask_proxies_bound():
        engine = LLM(**arguments, enable_lora=True, max_lora_rank=RANK, max_loras=len(VERSIONS))
    yield engine
    del engine


def _sample(llm, adapter: Path | None, version: int) -> list[Sample]:
    from vllm import SamplingParams
    from vllm.lora.request import LoRARequest

    params = SamplingParams(
        max_tokens=NEW_TOKENS, temperature=1.0, logprobs=0, detokenize=False, seed=version, ignore_eos=True
    )
    request = LoRARequest(f"policy-{version}", version, str(adapter)) if adapter else None
    outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, lora_request=request, use_tqdm=False)
    samples = []
    for prompt, output in zip(PROMPTS, outputs, strict=True):
        done = output.outputs[0]
        ids = list(done.token_ids)
        samples.append(Sample(prompt, ids, [e[t].logprob for e, t in zip(done.logprobs, ids, strict=True)]))
    return samples


def _learner_logprobs(model, samples: list[Sample]) -> torch.Tensor:
    """The learner's log-probs of the sampled tokens, through the trainer's own scoring."""
    rows = []
    with torch.no_grad():
        for s in samples:
            ids = torch.tensor([s.prompt + s.tokens])
            logprobs, _, _ = score_tokens(model, ids, None, len(s.prompt), 1.0, False, None)
            rows.append(logprobs[0])
    return torch.cat(rows)


def mismatch_kl(learner: torch.Tensor, samples: list[Sample]) -> float:
    """The loss's mismatch KL: the mean k3 of the rollout's log-probs against the learner's."""
    rollout = torch.tensor([lp for s in samples for lp in s.logprobs])
    return float(k3(learner, rollout).mean())


def _set_version(model, adapter: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(adapter / "adapter_model.safetensors"))


@pytest.mark.parametrize("version", VERSIONS)
def test_the_adapter_moves_the_policy_far_beyond_the_bound(policy, llm, version):
    _, model, adapters = policy
    _set_version(model, adapters[version])
    samples = _sample(llm, adapters[version], version)
    ids = torch.tensor([s.prompt + s.tokens for s in samples])
    with torch.no_grad():
        adapted = torch.log_softmax(model(ids).logits.float(), -1)
        with model.disable_adapter():
            base = torch.log_softmax(model(ids).logits.float(), -1)
    exact = (adapted.exp() * (adapted - base)).sum(-1)[:, len(PROMPTS[0]) - 1 : -1].mean()
    assert exact > 30 * BOUND, float(exact)


@pytest.mark.parametrize("version", VERSIONS)
def test_mismatch_kl_with_the_adapter_on_both_sides_is_within_the_bound(policy, llm, version):
    _, model, adapters = policy
    _set_version(model, adapters[version])
    samples = _sample(llm, adapters[version], version)
    assert all(len(s.tokens) == NEW_TOKENS for s in samples)
    assert mismatch_kl(_learner_logprobs(model, samples), samples) <= BOUND


def test_mismatch_kl_exceeds_the_bound_when_the_rollout_serves_the_base_model(policy, llm):
    _, model, adapters = policy
    _set_version(model, adapters[VERSIONS[-1]])
    samples = _sample(llm, None, VERSIONS[-1])
    assert mismatch_kl(_learner_logprobs(model, samples), samples) > 10 * BOUND


def test_mismatch_kl_exceeds_the_bound_when_the_learner_scores_without_the_adapter(policy, llm):
    _, model, adapters = policy
    _set_version(model, adapters[VERSIONS[-1]])
    samples = _sample(llm, adapters[VERSIONS[-1]], VERSIONS[-1])
    with model.disable_adapter():
        assert mismatch_kl(_learner_logprobs(model, samples), samples) > 10 * BOUND


def test_mismatch_kl_exceeds_the_bound_when_the_rollout_serves_an_older_version(policy, llm):
    _, model, adapters = policy
    _set_version(model, adapters[VERSIONS[-1]])
    samples = _sample(llm, adapters[VERSIONS[0]], VERSIONS[0])
    assert mismatch_kl(_learner_logprobs(model, samples), samples) > 10 * BOUND
