"""One vLLM engine, token-in/token-out, with versioned in-place weight updates.

Every generated token comes back with its sampling log-prob (of the distribution actually sampled:
`processed_logprobs`, so temperature is included) and the policy version that sampled it. The prefix
cache is salted with the policy version, so a new policy never reuses an old policy's KV blocks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from kuberl.api.spec import EngineSpec, LoraSpec
from kuberl_rollout.adapters import Adapter, AdapterSet, lora_engine_arguments
from kuberl_rollout.weights import WeightError, staging_folder

log = logging.getLogger("kuberl.rollout")
WORKER_EXTENSION = "kuberl_rollout.worker_extension.WeightUpdateExtension"
UpdateMode = Literal["keep", "wait", "abort"]


@dataclass(frozen=True)
class Generation:
    """What one generate call produced."""

    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    """Policy version that sampled each token (they differ when weights changed mid-request)."""
    finish_reason: str | None


@dataclass(frozen=True)
class EngineConfig:
    """What the engine is built from: the model folder and the RLJob's engine options."""

    model_path: str
    spec: EngineSpec
    dtype: str = "float32"
    max_model_len: int = 4096
    seed: int = 0
    lora: LoraSpec | None = None
    """spec.model.lora: each policy version is an adapter on these base weights (None: full weights)."""
    max_staleness: int = 0
    """How many versions behind the newest a request may still sample with (0 in sync mode)."""


def engine_arguments(config: EngineConfig) -> dict:
    """vLLM's engine arguments for `config` on this machine: what the rollout server runs, and what a benchmark
    measuring vLLM's own capacity (`vllm.LLM(**engine_arguments(config))`) must run to compare like with like."""
    spec = config.spec
    chunking = {}
    if not _has_cuda():
        # vLLM 0.32 on CPU cannot roll back a seeded request's generator after a partial prefill
        # ("CPU Generator does not use offset"): prefill whole prompts in one step instead
        chunking = {"enable_chunked_prefill": False, "max_num_batched_tokens": max(config.max_model_len, 8192)}
    return {
        "model": config.model_path,
        "dtype": config.dtype,
        "seed": config.seed,
        "max_model_len": config.max_model_len,
        "max_num_seqs": spec.max_num_seqs,
        "enable_prefix_caching": spec.enable_prefix_caching,
        "tensor_parallel_size": spec.tensor_parallel_size,
        "gpu_memory_utilization": spec.gpu_memory_utilization,
        "enforce_eager": True,
        "logprobs_mode": "processed_logprobs",
        **chunking,
        **(lora_engine_arguments(config.lora, config.max_staleness) if config.lora else {}),
    }


class RolloutEngine:
    """An AsyncLLM plus the policy version it serves."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.version = 0
        self.kv_cache_usage = 0.0
        """Fraction of the KV cache in use at the last engine step (from vLLM's scheduler stats)."""
        self.waiting_requests = 0
        self._llm = None
        self._ids = itertools.count()
        self._update_lock = asyncio.Lock()
        self.adapters: AdapterSet | None = None
        """With LoRA: the adapter of each version still in use (the weights are the base model's)."""
        self._retiring: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Build the engine (tens of seconds on CPU)."""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        cpu = not _has_cuda()
        if cpu:
            _run_eagerly_on_cpu(self.config.spec.tensor_parallel_size)
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        if cpu:
            _inspect_architectures_here(self.config.model_path)
        args = AsyncEngineArgs(
            **engine_arguments(self.config), worker_extension_cls=WORKER_EXTENSION, disable_log_stats=True
        )
        config = args.create_engine_config()  # on CPU this sets vLLM's process start method to spawn
        if cpu and self.config.spec.tensor_parallel_size == 1 and _only_thread():
            # spawn is there for the OpenMP settings of tensor-parallel workers, read as a new process loads
            # OpenMP; one engine core with its worker needs none, and a fork skips a second import of vLLM and
            # torch: 12 CPU-s to a ready engine instead of 21. Only from a process with no other thread to fork.
            os.environ["VLLM_WORKER_MULTIPROC_METHOD"] = "fork"
        self._llm = AsyncLLM.from_vllm_config(config, stat_loggers=[_stats_recorder(self)])
        if self.config.lora is not None:
            keep = self.config.max_staleness + 1
            root = staging_folder("kuberl-adapters-")
            self.adapters = AdapterSet(self.config.lora, self.config.model_path, keep, root)
        await self._llm.update_weight_version(str(self.version))

    @property
    def llm(self):
        if self._llm is None:
            raise RuntimeError("engine not started")
        return self._llm

    @property
    def ready(self) -> bool:
        return self._llm is not None and not self.dead

    @property
    def dead(self) -> bool:
        """The engine process died; every request fails from now on, so the server must be replaced."""
        return self._llm is not None and bool(getattr(self._llm, "errored", False))

    async def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_token_ids: list[int] | None = None,
        seed: int | None = None,
        min_tokens: int = 0,
    ) -> Generation:
        """Sample a continuation of `prompt_ids`; ids in, ids out, nothing decoded."""
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            logprobs=0,
            detokenize=False,
            stop_token_ids=stop_token_ids or [],
            seed=seed,
            min_tokens=min_tokens,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        if self.adapters is None:
            return await self._sample(prompt_ids, params, None)
        try:
            with self.adapters.use() as adapter:
                return await self._sample(prompt_ids, params, adapter)
        finally:
            self._retire_soon()  # this request may have been the last user of an old version

    async def _sample(self, prompt_ids: list[int], params, adapter: Adapter | None) -> Generation:
        """One request on the full weights served now, or on `adapter` (its version for every token: a request
        keeps its adapter however many versions arrive meanwhile)."""
        from vllm.inputs import TokensPrompt

        version = self.version if adapter is None else adapter.version
        prompt = TokensPrompt(prompt_token_ids=prompt_ids, cache_salt=f"policy-{version}")
        lora = None if adapter is None else adapter.request
        final = None
        async for output in self.llm.generate(prompt, params, request_id=f"g{next(self._ids)}", lora_request=lora):
            final = output
        assert final is not None
        completion = final.outputs[0]
        ids = list(completion.token_ids)
        logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], ids, strict=True)]
        spans = completion.weight_versions if adapter is None else None
        return Generation(ids, logprobs, _versions(spans, len(ids), version), completion.finish_reason)

    async def update_weights(self, files: list[Path], version: int, mode: UpdateMode = "wait") -> None:
        """Switch to the weights in staged safetensors files (the buckets of one update) as policy `version`,
        atomically between steps. Only the paths cross to the engine's process; its worker reads the files.
        With LoRA the files hold version's adapter: it is registered beside the older ones, nothing pauses."""
        if self.adapters is not None:
            await self._add_adapter(files, version)
            return
        await self._swap(version, mode, "load_weights_files", ([str(f) for f in files],))

    async def _swap(self, version: int, mode: UpdateMode, method: str, args: tuple) -> None:
        async with self._update_lock:
            # Paused, the scheduler runs no step: no request ever sees half-loaded weights.
            await self.llm.pause_generation(mode=mode, clear_cache=True)
            try:
                await self.llm.collective_rpc(method, args=args)
                await self.llm.reset_prefix_cache()
                await self.llm.update_weight_version(str(version))
                self.version = version
            finally:
                await self.llm.resume_generation()

    async def _add_adapter(self, files: list[Path], version: int) -> None:
        """Register `version`'s adapter (loaded now, not by its first request) and make it current for new
        requests; requests in flight finish on theirs."""
        adapters = self.adapters
        assert adapters is not None
        async with self._update_lock:
            adapter = await asyncio.to_thread(adapters.write, version, files)
            try:
                await self.llm.add_lora(adapter.request)
            except Exception as err:
                adapters.delete(adapter)
                if self.dead:  # not the adapter's fault: the server is being replaced
                    raise
                raise WeightError(f"version {version}: vLLM refused the adapter ({err})") from None
            adapters.publish(adapter)
            self.version = version
        await self.retire_adapters()

    async def retire_adapters(self) -> None:
        """Unload the adapters no request needs any more (older than the kept versions) and delete their folders."""
        if self.adapters is None or self._llm is None:
            return
        for adapter in self.adapters.retire():
            try:
                await self.llm.remove_lora(adapter.lora_id)
            finally:
                self.adapters.delete(adapter)

    def _retire_soon(self) -> None:
        if self.adapters is not None and self._llm is not None:
            task = asyncio.ensure_future(self.retire_adapters())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = None


def _stats_recorder(engine: RolloutEngine):
    """A vLLM stat logger class that copies scheduler stats onto `engine` (for our Prometheus gauges)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class SchedulerStatsRecorder(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                engine.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
                engine.waiting_requests = int(scheduler_stats.num_waiting_reqs)

        def log_engine_initialized(self) -> None:
            pass

    return SchedulerStatsRecorder


def _versions(spans, count: int, fallback: int) -> list[int]:
    if not spans:
        return [fallback] * count
    versions = [fallback] * count
    for span in spans:
        for i in range(span.start, min(span.end, count)):
            versions[i] = int(span.version)
    return versions


def _run_eagerly_on_cpu(tensor_parallel_size: int) -> None:
    """vLLM's process settings for an engine on CPU."""
    # the engine runs eagerly anyway: without this its sampler still compiles a rank count with inductor at the
    # first request (a C++ compiler run per kernel, per pod where /tmp holds no cache). A spawned engine core
    # reads the variable as it imports torch; a forked one inherits this process's setting, read when something
    # (transformers) first imported torch._dynamo.
    os.environ.setdefault("TORCH_COMPILE_DISABLE", "1")
    import torch._dynamo.config

    torch._dynamo.config.disable = os.environ["TORCH_COMPILE_DISABLE"] == "1"
    if tensor_parallel_size == 1:
        # vLLM on CPU otherwise runs its one worker in a third process (API server, engine core, worker), each
        # importing vLLM: in the engine core instead, a replacement server is ready in 17 s, not 24
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def _inspect_architectures_here(model_path: str) -> None:
    """Register the model's architectures with their classes, imported in this process. vLLM otherwise inspects
    a lazily registered class in a fresh interpreter, to keep CUDA out of this one: 10 CPU-s at every start whose
    cache under HOME is empty, as a new pod's is. On CPU there is no CUDA to keep out, and a forked engine core
    inherits the import it would make anyway."""
    from vllm import ModelRegistry

    config = json.loads((Path(model_path) / "config.json").read_text())
    for architecture in config.get("architectures") or []:
        registered = ModelRegistry.models.get(architecture)
        if registered is not None:  # one vLLM lacks is refused by the engine's own check, with its message
            ModelRegistry.register_model(architecture, registered.load_model_cls())


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _only_thread() -> bool:
    """Whether this process runs no thread but the caller's (native ones included: an OpenMP pool, a tokenizer's
    workers), so that a fork copies everything that runs."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False
