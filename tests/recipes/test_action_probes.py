"""Action probes score the real episode's actions: the first `run_tests` and the correct `replace`."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, parse_tool_call
from kuberl.suites import load_tasks
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from recipes.swe_toy.action_probes import CHECK, EDIT, action_logprob, mean_logprobs, swe_toy_probes
from recipes.swe_toy.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("probes") / "m", hidden_size=64, layers=1, seed=2)


def probes_for(sandbox, chat, task):
    async def play():
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, lambda ctx: None)
        try:
            return await swe_toy_probes(env, chat, SWE_SYSTEM_PROMPT, task)
        finally:
            await env.close()
            await client.aclose()

    return asyncio.run(play())


def test_probes_are_the_first_check_and_the_correct_edit_in_the_real_episode(sandbox, tiny):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    task = load_tasks("swe-toy", split="test")[0]
    check, edit = probes_for(sandbox, ChatFormat(tokenizer), task)
    assert (check.action, edit.action) == (CHECK, EDIT)
    assert check.action_ids[-1] == edit.action_ids[-1] == tokenizer.eos_token_id
    assert parse_tool_call(tokenizer.decode(check.action_ids[:-1])).name == "run_tests"
    call = parse_tool_call(tokenizer.decode(edit.action_ids[:-1]))
    assert call.arguments == {"path": task.metadata["file"], "old": task.metadata["buggy"], "new": task.metadata["fix"]}
    # the edit's context is the real episode: the failing test named the fix and the wrong expression
    context = tokenizer.decode(edit.context_ids)
    assert f"should use {task.metadata['fix']}, not {task.metadata['buggy']}" in context
    assert edit.context_ids[: len(check.context_ids)] == check.context_ids

    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32)
    full = torch.tensor([edit.context_ids + edit.action_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=full).logits[0, :-1], -1)
    expected = sum(logp[i - 1, full[0, i]].item() for i in range(len(edit.context_ids), full.shape[1]))
    assert action_logprob(model, edit) == pytest.approx(expected, abs=1e-4)
    assert mean_logprobs(model, [check, edit]) == pytest.approx({CHECK: action_logprob(model, check), EDIT: expected})
