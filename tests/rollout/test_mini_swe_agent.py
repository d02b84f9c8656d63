"""mini-swe-agent as an external agent (kuberl/integrations/mini_swe_agent.py): its commands run in the episode's
sandbox session and its submit command submits there; a rollout server runs its episodes on swe-toy with a tiny
model, the learner trains two steps on them (publishing the new weights between), and the trained ids are the
ids the engine sampled for mini-swe-agent's calls."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import httpx
import pytest
import torch
from helpers.agent_server import AUTH, JOB_TOKEN
from transformers import AutoTokenizer

from kuberl.api.sessions_http import SessionInfo
from kuberl.api.spec import AlgorithmSpec, FsdpSpec
from kuberl.api.trajectory import Trajectory
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl_rollout.agent import EpisodeLimits
from kuberl_rollout.external_agent import EpisodeEnvironment
from kuberl_rollout.recorded_sessions import RecordedSession
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import collate, group_advantages
from kuberl_trainer.export import policy_buckets
from kuberl_trainer.policy import load_policy
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.step import predict, train_step

TASK = generate(4, seed=5)[0]
STEPS = 8  # helpers/mini_swe_agent_job.py's step limit


@pytest.fixture(scope="module")
def mswea_server(sandbox, tmp_path_factory):
    """A rollout server whose job's agent is mini-swe-agent (helpers/mini_swe_agent_job.py)."""
    from helpers.agent_server import agent_server

    folder = tmp_path_factory.mktemp("mini-swe-agent")
    saved = folder / "trajectories"
    env = {"KUBERL_TEST_MSWEA_DIR": str(saved)}
    with agent_server(sandbox, folder, "helpers.mini_swe_agent_job:solve", STEPS, env) as server:
        yield {**server, "saved": saved}


def test_commands_run_in_the_sandbox_session_and_the_submit_command_submits(sandbox):
    # imported here, not at collection: litellm's import alone takes seconds in every test worker
    from minisweagent.exceptions import Submitted

    from kuberl.integrations.mini_swe_agent import SUBMIT, SandboxBashEnvironment, in_own_thread

    async def play() -> tuple[list[dict], str, EpisodeEnvironment]:
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"))
        observation = await env.reset(TASK)
        local = RecordedSession("local", TASK, "g", "unused", tokenizer=None)
        handle = EpisodeEnvironment(env, observation, local, EpisodeLimits())
        loop = asyncio.get_running_loop()
        bash = SandboxBashEnvironment(
            handle, lambda c: asyncio.run_coroutine_threadsafe(c, loop).result(), env={"GREETING": "it's me"}
        )

        def agent_side() -> tuple[list[dict], str]:
            outputs = [bash.execute({"command": c}) for c in ("ls", "echo $GREETING; exit 3", "sleep 0")]
            try:
                bash.execute({"command": f"echo {SUBMIT}"})
            except Submitted as submitted:
                return outputs, submitted.messages[0]["extra"]["submission"]
            raise AssertionError("the submit command did not submit")

        try:
            outputs, submission = await in_own_thread(agent_side)
        finally:
            await env.close()
            await client.aclose()
        return outputs, submission, handle

    outputs, submission, handle = asyncio.run(play())
    listing, greeting, quiet = outputs
    assert listing["returncode"] == 0 and all(path.split("/")[0] in listing["output"] for path in TASK.files)
    assert greeting == {"output": "it's me\n", "returncode": 3, "exception_info": ""}
    assert quiet == {"output": "", "returncode": 0, "exception_info": ""}
    assert submission.startswith("Submitted.") and "hidden tests passed" in submission
    assert handle.done and handle.steps == 5  # four commands and the submit, each a tool call of the episode


def saved_calls(folder: Path) -> dict[str, list[dict]]:
    """The assistant messages of each saved mini-swe-agent trajectory, by the session id of its base URL."""
    found = {}
    for path in folder.glob("*.traj.json"):
        data = json.loads(path.read_text())
        session_id = data["info"]["kuberl"]["base_url"].split("/v1/sessions/")[1].split("/")[0]
        found[session_id] = [m for m in data["messages"] if m["role"] == "assistant"]
    return found


@pytest.mark.slow
def test_mini_swe_agent_trains_a_tiny_model_on_the_ids_it_was_sampled(mswea_server):
    url = mswea_server["url"]
    rollout = RolloutClient([url], JOB_TOKEN)
    tokenizer = AutoTokenizer.from_pretrained(mswea_server["model"])
    model = load_policy(str(mswea_server["model"]), FsdpSpec(activation_checkpointing=False), torch.device("cpu"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    reuse: list[tuple[int, int]] = []
    for step in (1, 2):
        group = rollout.submit_task(TASK, size=2, seed=step)
        trajectories = collect(rollout, group.group_id, 2)
        calls = saved_calls(mswea_server["saved"])
        for t in trajectories:
            assert (t.error, t.finish_reason, t.history_mismatches) == (None, "max_turns", 0), t.error
            assert len(t.turns) == STEPS and {turn.tool for turn in t.turns} <= {"run", None}
            versions = {v for v, generated in zip(t.policy_versions, t.loss_mask, strict=True) if generated}
            assert versions == {step - 1}  # sampled with the weights of the step before
            # each turn's generated ids are the ids sampled for that call (as its answer, which mini-swe-agent
            # saved, carries them), and its text is the answer's
            answers = calls[t.trajectory_id]
            assert len(answers) == STEPS
            for turn, answer in zip(t.turns, answers, strict=True):
                trained = t.token_ids[turn.start : turn.action_end]
                assert trained == answer["extra"]["response"]["choices"][0]["token_ids"]
                assert t.loss_mask[turn.start : turn.action_end] == [1] * len(trained)
                assert tokenizer.decode(trained, skip_special_tokens=True) == answer["content"]
            info = SessionInfo.model_validate_json(
                httpx.get(f"{url}/v1/sessions/{t.trajectory_id}", headers=AUTH).content
            )
            assert info.calls == STEPS and info.reused_tokens > info.encoded_tokens
            reuse.append((info.reused_tokens, info.encoded_tokens))

        collated = collate(trajectories, pad_id=0)
        for row, t in enumerate(trajectories):  # the trained ids are the recorded ones
            assert collated.batch.input_ids[row, : len(t.token_ids)].tolist() == t.token_ids
        collated.batch.advantages = group_advantages(collated, AlgorithmSpec(group_size=2))
        mask = collated.batch.loss_mask
        learner = predict(model, collated.batch).logprobs[mask]
        assert (learner - collated.batch.rollout_logprobs[mask]).abs().max() < 1e-2  # the sampled ids, in context
        report = train_step(model, optimizer, collated.batch, LossConfig(), 1.0, 1)
        assert report.tokens == sum(t.generated_tokens for t in trajectories) and report.skipped == 0
        assert rollout.publish(step, policy_buckets(model)) == [0]

    reused, encoded = sum(r for r, _ in reuse), sum(e for _, e in reuse)
    print(f"\nreuse: {reused / (reused + encoded):.1%} of the prompt tokens of {STEPS}-call mini-swe-agent episodes")


def collect(rollout: RolloutClient, group_id: str, count: int, timeout: float = 180.0) -> list[Trajectory]:
    found: list[Trajectory] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += [t for t in rollout.collect(wait=2.0).trajectories if t.group_id == group_id]
    assert len(found) == count, f"{len(found)} of {count} trajectories arrived"
    return found
