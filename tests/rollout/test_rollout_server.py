"""A real rollout server (vLLM on CPU) with a tiny Llama that learned the tool format from one
demonstration, against a real sandbox server. Tests run in file order: the weight update and the
killed sandbox come last."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import torch
import yaml
from safetensors.torch import save
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.api.environment import ToolCall
from kuberl.http_probes import wait_until_ready
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, format_tool_call
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl.tokens import bearer, new_token
from kuberl_rollout.engine import _only_thread
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_sandbox.local import free_port, local_sandbox
from kuberl_trainer.demonstrations import demonstration_tokens
from kuberl_trainer.sft import supervised_fit
from kuberl_trainer.weight_transport import StoredWeights
from recipes.swe_toy.demonstrations import record_demonstration
from recipes.swe_toy.tiny_model import build_tiny_model

pytestmark = pytest.mark.slow
TOKEN = new_token()
API = httpx.Client(headers=bearer(TOKEN))
"""Calls with the job token of the server under test."""
TASK = generate(8, seed=21)[3]
FILE, BUGGY, FIX = TASK.metadata["file"], TASK.metadata["buggy"], TASK.metadata["fix"]
# Short enough for a tiny model to memorise from one demonstration and replay greedily.
CALLS = [
    ToolCall(name="replace", arguments={"path": FILE, "old": BUGGY, "new": FIX}),
    ToolCall(name="run_tests"),
    ToolCall(name="submit"),
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(rollout URL, sandbox, model folder, tokenizer, rollout process)."""
    folder = tmp_path_factory.mktemp("rollout")
    with local_sandbox() as sandbox:
        base = build_tiny_model(folder / "base", hidden_size=128, layers=4, heads=4, seed=1)
        tokenizer = AutoTokenizer.from_pretrained(base)

        async def demo():
            client = SandboxClient(sandbox.url, sandbox.token)
            env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"))
            played = await record_demonstration(env, SWE_SYSTEM_PROMPT, TASK, CALLS)
            await env.close()
            await client.aclose()
            return played

        played = asyncio.run(demo())
        assert played.finished
        demonstration = demonstration_tokens(played.demonstration, ChatFormat(tokenizer))
        losses = supervised_fit(
            base, [(demonstration.token_ids, demonstration.loss_mask)], folder / "policy", steps=300, learning_rate=3e-3
        )
        assert losses[-1] < 0.05, losses[-5:]
        job = {
            "apiVersion": "kuberl.io/v1alpha1",
            "kind": "RLJob",
            "metadata": {"name": "rollout-test"},
            "spec": {
                "model": {"uri": str(folder / "policy"), "dtype": "float32", "maxContextTokens": 4096},
                "environment": {
                    "maxTurns": 6,
                    "maxTokensPerTrajectory": 4096,
                    "turnTimeout": "30s",
                    "trajectoryTimeout": "2m",
                },
                "reward": {"intermediateRewards": True},
                "rollout": {
                    "temperature": 0.0,
                    "concurrentSessions": 8,
                    "maxTokensPerTurn": 128,
                    "engine": {"maxNumSeqs": 16, "maxModelLen": 4096},
                },
            },
        }
        (folder / "job.yaml").write_text(yaml.safe_dump(job))
        port = free_port()
        (folder / "tmp").mkdir()
        env = {
            **os.environ,
            "TMPDIR": str(folder / "tmp"),  # where torch's compilers would put their work
            "VLLM_CACHE_ROOT": str(folder / "vllm-cache"),  # empty, as a new pod's
            "KUBERL_SANDBOX_TOKEN": sandbox.token,
            "KUBERL_JOB_TOKEN": TOKEN,
            "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
        }
        log = (folder / "rollout.log").open("w")
        argv = [
            sys.executable,
            "-m",
            "kuberl_app.cli",
            "rollout-server",
            str(folder / "job.yaml"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--sandbox-url",
            sandbox.url,
        ]
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        wait_until_ready(url + "/readyz", proc, folder / "rollout.log", timeout=180)
        try:
            yield {
                "url": url,
                "sandbox": sandbox,
                "policy": folder / "policy",
                "tokenizer": tokenizer,
                "demonstration": demonstration,
                "tmp": folder / "tmp",
                "vllm_cache": folder / "vllm-cache",
            }
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def collect(url: str, count: int, timeout: float = 120) -> list[dict]:
    found, deadline = [], time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += API.get(url + "/v1/trajectories", params={"wait": 10}, timeout=30).json()["trajectories"]
    assert len(found) == count, f"only {len(found)} of {count} trajectories"
    return found


def test_only_a_process_without_other_threads_forks_its_engine_core():
    """A fork copies only the thread that forks: a lock another thread held stays locked in the engine core."""
    probe = [sys.executable, "-c", "from kuberl_rollout.engine import _only_thread; print(_only_thread())"]
    assert subprocess.run(probe, capture_output=True, text=True, check=True).stdout.strip() == "True"
    release = threading.Event()
    other = threading.Thread(target=release.wait)
    other.start()
    try:
        assert not _only_thread()
    finally:
        release.set()
        other.join()


def test_a_multi_turn_trajectory_is_recorded_token_in_token_out(world):
    url, tokenizer = world["url"], world["tokenizer"]
    group = API.post(url + "/v1/groups", json={"task": TASK.to_manifest(), "groupSize": 2}).json()
    trajectories = collect(url, 2)
    for t in trajectories:
        assert t["groupId"] == group["groupId"] and t["finishReason"] == "submitted", tokenizer.decode(t["tokenIds"])
        assert t["finalReward"] == 1.0 and t["resolved"] is True
        ids, mask, turns = t["tokenIds"], t["lossMask"], t["turns"]
        assert [tokenizer.decode(ids[x["start"] : x["actionEnd"]]) for x in turns] == [
            format_tool_call(c) + "<|end|>" for c in CALLS
        ]
        generated = {i for x in turns for i in range(x["start"], x["actionEnd"])}
        assert {i for i, m in enumerate(mask) if m} == generated  # the mask covers exactly the generated tokens
        assert all(v == 0 for i, v in enumerate(t["policyVersions"]) if i in generated)
        assert all(
            t["logprobs"][i] == 0.0 and t["policyVersions"][i] == -1 for i in range(len(ids)) if i not in generated
        )
        # Decoding the ids reproduces the conversation: the prompt, then per turn call, observation, header.
        pieces = [tokenizer.decode(ids[: t["promptLength"]])]
        for x in turns:
            pieces += [
                tokenizer.decode(ids[x["start"] : x["actionEnd"]]),
                tokenizer.decode(ids[x["actionEnd"] : x["end"]]),
            ]
        assert "".join(pieces) == tokenizer.decode(ids)
        assert pieces[0].startswith("<|system|>" + SWE_SYSTEM_PROMPT) and TASK.prompt in pieces[0]
        first_observation = pieces[2]
        assert first_observation == f"<|tool|>Replaced 1 occurrence(s) in {FILE}.<|end|><|assistant|>"
        assert "OK" in pieces[4] and "[3/3 tests passed]" in pieces[4]
        assert [x["tool"] for x in turns] == ["replace", "run_tests", "submit"]


def test_sampling_logprobs_match_transformers(world):
    url, prompt = world["url"], world["demonstration"].token_ids[:60]
    out = API.post(
        url + "/v1/completions", json={"prompt": prompt, "max_tokens": 24, "temperature": 0.8, "seed": 3}, timeout=60
    ).json()["choices"][0]
    model = AutoModelForCausalLM.from_pretrained(world["policy"], dtype=torch.float32)
    ids = torch.tensor([prompt + out["token_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1] / 0.8
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(out["token_ids"])[:, None])[:, 0]
    mismatch = (expected - torch.tensor(out["logprobs"]["token_logprobs"])).abs().max().item()
    assert mismatch < 1e-4, mismatch  # fp32 on CPU: the train/inference mismatch is numerical noise


def test_the_engine_on_cpu_compiles_nothing_as_it_samples(world):
    """It runs eagerly: neither its warm-up nor a sampled completion with log-probs (the sampler's compiled rank
    count) starts a C++ compiler, which costs seconds of CPU in every new pod (its /tmp holds no cache)."""
    for seed in (5, 6):
        body = {"prompt": world["demonstration"].token_ids[:30], "max_tokens": 8, "temperature": 0.9, "seed": seed}
        assert API.post(world["url"] + "/v1/completions", json=body, timeout=60).status_code == 200
    assert sorted(p.name for p in world["tmp"].glob("torchinductor_*")) == []


def test_the_models_architecture_was_inspected_in_the_servers_process(world):
    """Not in a fresh interpreter (vLLM's way of keeping CUDA out of its process), which costs 10 CPU-s at every
    start with an empty cache and leaves its answer there."""
    assert not (world["vllm_cache"] / "modelinfos").exists()


def test_a_seeded_long_prompt_is_served(world):
    # a prompt longer than one prefill chunk, with a seed (every rollout episode has one): vLLM 0.32 on CPU
    # crashed here ("CPU Generator does not use offset") until the engine stopped chunking prefills
    prompt = (world["demonstration"].token_ids * 80)[:3500]
    r = API.post(
        world["url"] + "/v1/completions",
        json={"prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": 11},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"][0]["token_ids"]) >= 1
    assert API.get(world["url"] + "/readyz").status_code == 200  # and the engine is still alive


BAD = [
    ("POST", "/v1/groups", {"taskId": "no-such-task", "groupSize": 1}, 404, "unknown task 'no-such-task'"),
    ("POST", "/v1/groups", {"taskId": TASK.task_id, "groupSize": 0}, 422, "groupSize"),
    ("POST", "/v1/groups", {"groupSize": 2}, 422, "exactly one of taskId or task"),
    ("POST", "/v1/groups", {"taskId": TASK.task_id, "groupSize": 100000}, 422, "groupSize"),
    ("GET", "/v1/groups/nope", None, 404, "unknown group 'nope'"),
    ("POST", "/v1/groups", {"task": TASK.to_manifest() | {"failToPass": None}, "groupSize": 1}, 400, "no failToPass"),
    ("DELETE", "/v1/groups/nope", None, 404, "re-submit"),
    ("GET", "/v1/trajectories?limit=0", None, 422, "limit"),
    ("POST", "/v1/completions", {"prompt": [10**7], "max_tokens": 2}, 400, "token ids must lie in"),
    ("POST", "/v1/completions", {"max_tokens": 2}, 400, "prompt: Field required"),
    ("POST", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("POST", "/v1/weights/load", {"uri": "/no/such/folder", "version": 7}, 400, "no such file or folder"),
    ("POST", "/v1/weights/load", {"uri": "/tmp", "version": 0}, 422, "version"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), BAD, ids=[f"{b[0]} {b[1]} {b[3]}" for b in BAD])
def test_bad_input_gets_a_4xx_and_the_server_keeps_serving(world, method, path, body, status, words):
    response = API.request(method, world["url"] + path, json=body, timeout=30)
    assert response.status_code == status, response.text
    # the OpenAI-compatible routes answer in OpenAI's error shape, the work API with {detail}
    answer = response.json()
    assert words in (answer["error"]["message"] if path.endswith("completions") else answer["detail"])
    assert API.get(world["url"] + "/readyz").status_code == 200


@pytest.mark.parametrize(
    ("name", "shape", "words"),
    [("model.embed_tokens.weight", (3, 3), "has shape [3, 3]"), ("model.not_a_layer.weight", (2,), "unknown weight")],
)
def test_wrong_weight_names_and_shapes_are_refused(world, name, shape, words):
    response = API.put(
        world["url"] + "/v1/weights/9/buckets/0", params={"of": 1}, content=save({name: torch.zeros(shape)})
    )
    assert response.status_code == 400 and words in response.json()["detail"]


def greedy(url: str, prompt: list[int]) -> dict:
    return API.post(
        url + "/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0.0}, timeout=60
    ).json()["choices"][0]


def test_a_weight_update_switches_greedy_outputs_atomically(world):
    url, prompt = world["url"], world["demonstration"].token_ids[:40]
    before = greedy(url, prompt)["token_ids"]
    model = AutoModelForCausalLM.from_pretrained(world["policy"], dtype=torch.float32)
    torch.manual_seed(0)
    new_state = {k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()}
    model.load_state_dict(new_state)
    after_expected = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :]
    names = sorted(new_state)
    buckets = [save({n: new_state[n].contiguous() for n in names[i::2]}) for i in range(2)]

    async def race():
        async with httpx.AsyncClient(base_url=url, timeout=60, headers=bearer(TOKEN)) as http:

            async def ask():
                r = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 16, "temperature": 0.0})
                return r.json()["choices"][0]

            async def update():
                await asyncio.sleep(0.05)
                first = await http.put("/v1/weights/1/buckets/0", params={"of": 2}, content=buckets[0])
                second = await http.put("/v1/weights/1/buckets/1", params={"of": 2}, content=buckets[1])
                return first.json(), second.json()

            return await asyncio.gather(update(), *(ask() for _ in range(8)))

    (first, second), *answers = asyncio.run(race())
    assert first["applied"] is False and second["applied"] is True
    expected = {0: before, 1: after_expected.tolist()}
    assert before != expected[1]
    for answer in answers:  # each request saw one version or the other, never a mixture
        versions = set(answer["policy_versions"])
        assert len(versions) == 1 and answer["token_ids"] == expected[versions.pop()][: len(answer["token_ids"])]
    assert greedy(url, prompt)["token_ids"] == after_expected.tolist()
    assert API.get(url + "/v1/policy").json()["version"] == 1
    metrics = API.get(url + "/metrics").text
    assert (
        "kuberl_rollout_weight_sync_seconds_count 1.0" in metrics and "kuberl_rollout_kv_cache_usage_ratio" in metrics
    )


def test_without_partial_rollouts_no_trajectory_mixes_policy_versions(world):
    url = world["url"]
    model = AutoModelForCausalLM.from_pretrained(world["policy"], dtype=torch.float32)
    API.post(url + "/v1/groups", json={"task": TASK.to_manifest(), "groupSize": 4})
    update = API.put(
        url + "/v1/weights/2/buckets/0",
        params={"of": 1},
        timeout=120,
        content=save({k: v.contiguous() for k, v in model.state_dict().items()}),
    )
    assert update.json()["applied"] is True
    for t in collect(url, 4):
        versions = {v for v, m in zip(t["policyVersions"], t["lossMask"], strict=True) if m}
        assert len(versions) == 1, versions
    assert API.get(url + "/v1/policy").json()["version"] == 2


def test_weights_stored_once_are_loaded_by_the_engine_from_storage(world, tmp_path):
    """StoredWeights: the learner writes the version under a storage prefix, the server checks the files and
    its engine's worker reads them; greedy outputs are then the new model's."""
    url, prompt = world["url"], world["demonstration"].token_ids[:40]
    model = AutoModelForCausalLM.from_pretrained(world["policy"], dtype=torch.float32)
    torch.manual_seed(1)
    model.load_state_dict({k: v + 0.3 * torch.randn_like(v) for k, v in model.state_dict().items()})
    expected = model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :].tolist()
    names = sorted(model.state_dict())
    buckets = [save({n: model.state_dict()[n].contiguous() for n in names[i::3]}) for i in range(3)]
    version = API.get(url + "/v1/policy").json()["version"] + 1
    with httpx.Client(base_url=url, timeout=120, headers=bearer(TOKEN)) as http:
        StoredWeights(str(tmp_path / "weights")).send(http, version, buckets)
    assert len(list((tmp_path / "weights" / f"v{version:08d}").glob("*.safetensors"))) == 3
    assert API.get(url + "/v1/policy").json()["version"] == version
    assert greedy(url, prompt)["token_ids"] == expected


def test_a_killed_sandbox_fails_trajectories_with_a_reason_and_never_hangs(world):
    url = world["url"]
    API.post(url + "/v1/groups", json={"task": TASK.to_manifest(), "groupSize": 3})
    os.kill(world["sandbox"].pid, signal.SIGKILL)  # while the episodes open their sessions and take turns
    started = time.monotonic()
    trajectories = collect(url, 3, timeout=90)
    assert time.monotonic() - started < 90
    failed = [t for t in trajectories if t["finishReason"] == "error"]
    assert failed and all("sandbox failed" in t["error"] for t in failed)
    assert API.get(url + "/readyz").status_code == 200
