"""External agents (`spec.environment.agent`): an ordinary OpenAI-client loop (tests/helpers/openai_agent.py)
plays the episodes the learner asks for, its trajectories arrive through the learner's own client and a train
step takes them; an agent that raises fails its episode, not the server; an entry point that cannot be
imported is a validation error naming the field."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml
from click.testing import CliRunner
from helpers.agent_server import AUTH, JOB_TOKEN

from kuberl.api.sessions_http import OpenedSession, SessionInfo
from kuberl.api.spec import AlgorithmSpec, FsdpSpec
from kuberl.api.trajectory import Trajectory
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl_app.cli import main
from kuberl_rollout.agent import EpisodeLimits
from kuberl_rollout.external_agent import EpisodeEnvironment
from kuberl_rollout.recorded_sessions import RecordedSession
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironment
from kuberl_trainer.algorithms.losses import LossConfig
from kuberl_trainer.batching import collate, group_advantages
from kuberl_trainer.policy import load_policy
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.step import predict, train_step

TASK = generate(4, seed=5)[0]
GETTING_STARTED = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"


def collect(rollout: RolloutClient, group_id: str, count: int, timeout: float = 120.0) -> list[Trajectory]:
    found: list[Trajectory] = []
    deadline = time.monotonic() + timeout
    while len(found) < count and time.monotonic() < deadline:
        found += [t for t in rollout.collect(wait=2.0).trajectories if t.group_id == group_id]
    assert len(found) == count, f"{len(found)} of {count} trajectories arrived"
    return found


def counters(url: str) -> dict[str, float]:
    """The session prompt tokens by source (`reused`, `encoded`) and the `generated` tokens, from /metrics."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    found = [line for line in lines if line.startswith("kuberl_rollout_session_prompt_tokens_total{")]
    (generated,) = [line for line in lines if line.startswith("kuberl_rollout_generated_tokens_total ")]
    return {line.split('"')[1]: float(line.split()[-1]) for line in found} | {"generated": float(generated.split()[-1])}


@pytest.mark.slow
def test_an_openai_client_loop_trains_through_the_learners_stream(agent_server):
    rollout = RolloutClient([agent_server["url"]], JOB_TOKEN)
    before = counters(agent_server["url"])
    group = rollout.submit_task(TASK, size=2, seed=1)
    trajectories = collect(rollout, group.group_id, 2)
    after = counters(agent_server["url"])
    reused, encoded, generated = (after[k] - before[k] for k in ("reused", "encoded", "generated"))
    assert generated == sum(t.generated_tokens for t in trajectories)  # counted once
    assert reused > encoded > 0  # three calls an episode: the history's ids came back, the new messages were encoded
    print(f"\nreuse: {reused / (reused + encoded):.1%} of the prompt tokens of 3-call agent episodes")
    for t in trajectories:
        assert (t.error, t.finish_reason, t.history_mismatches, t.task_id) == (None, "submitted", 0, TASK.task_id)
        assert [turn.tool for turn in t.turns] == ["run_tests"] * 3 and t.resolved is False
        assert t.final_reward == 0.0 and t.sandbox_session_id and t.timings["environment"] > 0

    # a learner step takes them: the learner's log-probs of the recorded ids are the engine's sampling ones
    model = load_policy(str(agent_server["model"]), FsdpSpec(activation_checkpointing=False), torch.device("cpu"))
    collated = collate(trajectories, pad_id=0)
    collated.batch.advantages = group_advantages(collated, AlgorithmSpec(group_size=2))
    mask = collated.batch.loss_mask
    learner = predict(model, collated.batch).logprobs[mask]
    assert (learner - collated.batch.rollout_logprobs[mask]).abs().max() < 1e-2
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    report = train_step(model, optimizer, collated.batch, LossConfig(), 1.0, 1)
    assert report.tokens == sum(t.generated_tokens for t in trajectories) and report.skipped == 0


@pytest.mark.slow
def test_an_agent_that_raises_fails_its_episode_and_the_server_serves_on(agent_server):
    url = agent_server["url"]
    rollout = RolloutClient([url], JOB_TOKEN)
    crashing = TASK.model_copy(update={"metadata": {**TASK.metadata, "testAgent": "crash"}})
    group = rollout.submit_task(crashing, size=1, seed=2)
    (t,) = collect(rollout, group.group_id, 1)
    assert t.finish_reason == "error" and t.final_reward == 0.0
    assert t.error == "agent helpers.openai_agent:solve raised RuntimeError: the agent gave up"
    assert len(t.turns) == 1  # its one model call is kept, for the record
    assert httpx.get(f"{url}/readyz").status_code == 200
    metrics = httpx.get(f"{url}/metrics").text
    assert 'kuberl_rollout_trajectories_total{reason="error"} 1.0' in metrics


@pytest.mark.parametrize(
    ("agent", "words"),
    [
        ("helpers.no_such_module:solve", "cannot import module 'helpers.no_such_module'"),
        ("helpers.openai_agent:nowhere", "has no attribute 'nowhere'"),
        ("helpers.openai_agent:not_async", "must be an async function"),
    ],
)
def test_an_entry_point_that_cannot_be_used_is_a_validation_error(tmp_path, manifest, agent, words):
    manifest["spec"]["environment"] = {"agent": agent}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")])
    assert result.exit_code == 2
    assert "spec.environment.agent" in result.output and words in result.output


def test_a_usable_entry_point_validates(tmp_path, manifest):
    manifest["spec"]["environment"] = {"agent": "helpers.openai_agent:solve"}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(manifest))
    assert CliRunner().invoke(main, ["validate", str(tmp_path / "job.yaml")]).exit_code == 0


def getting_started_agent():
    """The agent of getting-started's "Train your own agent", as the page shows it."""
    section = GETTING_STARTED.read_text().split("## 4. Train your own agent")[1]
    namespace: dict = {}
    exec(compile(section.split("```python\n")[1].split("```")[0], str(GETTING_STARTED), "exec"), namespace)
    return namespace["solve"]


@pytest.mark.slow
def test_the_getting_started_agent_plays_an_episode(agent_server, sandbox):
    solve = getting_started_agent()
    answer = httpx.post(f"{agent_server['url']}/v1/sessions", json={}, headers=AUTH)
    session = OpenedSession.model_validate_json(answer.content)

    async def play() -> EpisodeEnvironment:
        client = SandboxClient(sandbox.url, sandbox.token)
        env = SandboxEnvironment(client, resolve_reward("swe-toy-tests"))
        observation = await env.reset(TASK)
        # the turns' tools land here; the agent's calls go to the server's session, with its key
        local = RecordedSession("local", TASK, "g", session.base_url, tokenizer=None, api_key=session.api_key)
        handle = EpisodeEnvironment(env, observation, local, EpisodeLimits())
        try:
            await solve(TASK, session.base_url, handle)
        finally:
            await env.close()
            await client.aclose()
        return handle

    handle = asyncio.run(play())
    assert handle.done and handle.steps <= 13  # within the default 16 tool calls
    info = SessionInfo.model_validate_json(
        httpx.get(f"{agent_server['url']}/v1/sessions/{session.id}", headers=AUTH).content
    )
    assert info.calls >= 1 and info.history_mismatches == 0
