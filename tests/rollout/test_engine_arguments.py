"""One set of vLLM engine arguments for the rollout server and for the benchmark measuring vLLM's own capacity
beside it: they are vLLM's arguments, and on CPU they prefill whole prompts (seeded sampling needs it)."""

from __future__ import annotations

import dataclasses

from kuberl.api.spec import EngineSpec
from kuberl_rollout.engine import EngineConfig, engine_arguments


def test_the_arguments_are_vllms_and_carry_the_jobs_engine_options(tmp_path):
    from vllm.engine.arg_utils import AsyncEngineArgs, EngineArgs

    config = EngineConfig(str(tmp_path), EngineSpec(max_num_seqs=48, enable_prefix_caching=False), max_model_len=9000)
    arguments = engine_arguments(config)
    fields = {f.name for f in dataclasses.fields(EngineArgs)}
    assert set(arguments) <= fields, set(arguments) - fields
    AsyncEngineArgs(**arguments)  # builds (nothing loads until the engine starts)
    assert (arguments["max_num_seqs"], arguments["enable_prefix_caching"]) == (48, False)
    assert arguments["logprobs_mode"] == "processed_logprobs"  # the sampled distribution's log-probs
    # this machine has no CUDA: whole prefills, each prompt up to max_model_len in one step
    assert arguments["enable_chunked_prefill"] is False and arguments["max_num_batched_tokens"] == 9000
