"""Recorded sessions, driven by the official `openai` client against a real rollout server (vLLM on CPU, a tiny
Llama): the trajectory of a multi-turn session holds exactly the sampled ids, the history's ids are reused
rather than re-tokenised, an edited history starts a counted new segment, and closed or unknown sessions are
refused in OpenAI's error shape with nothing recorded twice."""

from __future__ import annotations

import statistics
import time

import httpx
import openai
import pytest
from helpers.agent_server import AUTH, JOB_TOKEN
from transformers import AutoTokenizer

from kuberl.api.openai_http import ErrorResponse
from kuberl.api.sessions_http import ClosedSession, CloseSession, OpenedSession, OpenSession, SessionInfo

pytestmark = pytest.mark.slow
SYSTEM = {"role": "system", "content": "You fix bugs."}


@pytest.fixture(scope="module")
def tokenizer(agent_server):
    return AutoTokenizer.from_pretrained(agent_server["model"])


def open_session(url: str, **fields) -> OpenedSession:
    answer = httpx.post(f"{url}/v1/sessions", json=OpenSession(**fields).wire(), headers=AUTH)
    assert answer.status_code == 201, answer.text
    return OpenedSession.model_validate_json(answer.content)


def close(url: str, session_id: str, reward: float | None) -> httpx.Response:
    return httpx.post(f"{url}/v1/sessions/{session_id}/close", json=CloseSession(reward=reward).wire(), headers=AUTH)


def client(base_url: str, api_key: str = JOB_TOKEN) -> openai.OpenAI:
    """An OpenAI client of `base_url`: a session's with its API key, the server's with the job token."""
    return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)


def session_client(session: OpenedSession) -> openai.OpenAI:
    return client(session.base_url, session.api_key)


def ask(llm: openai.OpenAI, messages: list[dict], seed: int, stream: bool = False) -> dict:
    """One call: {content, ids, logprobs, prompt_ids}, streamed or not."""
    if not stream:
        answer = llm.chat.completions.create(model="policy", messages=messages, max_tokens=16, seed=seed)
        choice = answer.choices[0]
        logprobs = [t.logprob for t in choice.logprobs.content]
        ids, prompt_ids = choice.token_ids, answer.prompt_token_ids
        return {"content": choice.message.content, "ids": ids, "logprobs": logprobs, "prompt_ids": prompt_ids}
    chunks = list(llm.chat.completions.create(model="policy", messages=messages, max_tokens=16, seed=seed, stream=True))
    choices = [c.choices[0] for c in chunks if c.choices]
    return {
        "content": "".join(c.delta.content or "" for c in choices),
        "ids": [i for c in choices for i in c.token_ids],
        "logprobs": [t.logprob for c in choices if c.logprobs for t in c.logprobs.content],
        "prompt_ids": chunks[0].prompt_token_ids,
    }


def converse(llm: openai.OpenAI, turns: int, seed: int = 0) -> list[dict]:
    """A multi-turn conversation, its second call streamed: each answer goes back with an observation."""
    messages, calls = [SYSTEM, {"role": "user", "content": "Fix calc.py: add() returns a - b."}], []
    for turn in range(turns):
        call = ask(llm, messages, seed + turn, stream=turn == 1)
        calls.append(call)
        messages += [
            {"role": "assistant", "content": call["content"]},
            {"role": "tool", "content": f"FAILED (failures={turn + 1}): test_add"},
        ]
    return calls


def test_a_multi_turn_session_trains_exactly_the_sampled_ids(agent_server):
    url = agent_server["url"]
    session = open_session(url)
    assert session.base_url == f"{url}/v1/sessions/{session.id}/openai/v1"
    llm = session_client(session)
    assert [m.id for m in llm.models.list().data] == [str(agent_server["model"])]
    calls = converse(llm, turns=4)

    answer = close(url, session.id, 1.0)
    assert answer.status_code == 200, answer.text
    closed = ClosedSession.model_validate_json(answer.content)
    t = closed.trajectory
    assert (closed.session.calls, closed.session.segments, closed.session.history_mismatches) == (4, 1, 0)
    assert (t.final_reward, t.finish_reason, t.history_mismatches, len(t.turns)) == (1.0, "submitted", 0, 4)
    for turn, call in zip(t.turns, calls, strict=True):
        # the ids trained are the ids sampled, with their log-probs; each call saw everything before it as ids
        assert t.token_ids[turn.start : turn.action_end] == call["ids"]
        assert t.logprobs[turn.start : turn.action_end] == pytest.approx(call["logprobs"])
        assert t.token_ids[: turn.start] == call["prompt_ids"]
    generated = [i for i, m in zip(t.token_ids, t.loss_mask, strict=True) if m]
    assert generated == [i for call in calls for i in call["ids"]]
    # the prefix of every call after the first came from the previous call's ids: counted
    reused = sum(len(c["prompt_ids"]) for c in calls[:-1]) + sum(len(c["ids"]) for c in calls[:-1])
    assert closed.session.reused_tokens == reused
    total = sum(len(c["prompt_ids"]) for c in calls)
    assert closed.session.reused_tokens + closed.session.encoded_tokens == total
    print(f"\nreuse: {reused / total:.1%} of the prompt tokens of a 4-turn session came from earlier calls' ids")


def test_an_edited_history_starts_a_new_counted_segment(agent_server):
    url = agent_server["url"]
    session = open_session(url, group_id="edited")
    llm = session_client(session)
    messages = [SYSTEM, {"role": "user", "content": "Fix calc.py."}]
    first = ask(llm, messages, seed=1)
    edited = [*messages, {"role": "assistant", "content": "(summarised)"}, {"role": "user", "content": "go on"}]
    second = ask(llm, edited, seed=2)
    info = SessionInfo.model_validate_json(httpx.get(f"{url}/v1/sessions/{session.id}", headers=AUTH).content)
    assert (info.calls, info.segments, info.history_mismatches, info.reused_tokens) == (2, 2, 1, 0)

    t = ClosedSession.model_validate_json(close(url, session.id, 0.0).content).trajectory
    assert (t.history_mismatches, t.group_id, len(t.turns)) == (1, "edited", 1)
    assert t.token_ids == second["prompt_ids"] + second["ids"] and t.prompt_length == len(second["prompt_ids"])
    assert first["ids"] != t.token_ids[t.prompt_length :]
    (line,) = [x for x in httpx.get(f"{url}/metrics").text.splitlines() if x.startswith("kuberl_rollout_session_hist")]
    assert float(line.split()[-1]) >= 1


def test_closed_and_unknown_sessions_are_refused_in_openai_shape(agent_server):
    url = agent_server["url"]
    session = open_session(url)
    llm = session_client(session)
    ask(llm, [{"role": "user", "content": "hi"}], seed=3)
    without_reward = close(url, session.id, None)
    assert without_reward.status_code == 400 and "reward is required" in without_reward.text
    assert close(url, session.id, 0.5).status_code == 200

    with pytest.raises(openai.ConflictError, match="is closed"):
        ask(llm, [{"role": "user", "content": "hi"}], seed=4)
    again = close(url, session.id, 1.0)
    assert again.status_code == 409
    assert ErrorResponse.model_validate_json(again.content).error.code == "session_closed"
    info = SessionInfo.model_validate_json(httpx.get(f"{url}/v1/sessions/{session.id}", headers=AUTH).content)
    assert (info.closed, info.calls) == (True, 1)  # nothing of the refused call or close was recorded

    unknown = close(url, "no-such-session", 1.0)
    assert unknown.status_code == 404
    assert ErrorResponse.model_validate_json(unknown.content).error.code == "session_not_found"
    with pytest.raises(openai.NotFoundError, match="unknown session"):
        client(f"{url}/v1/sessions/no-such-session/openai/v1").models.list()
    idle = ClosedSession.model_validate_json(close(url, open_session(url).id, 0.0).content)
    assert idle.session.calls == 0 and idle.trajectory.generated_tokens == 0  # a prompt alone, nothing to train
    bad = httpx.post(f"{url}/v1/sessions", json={"taskId": "no-such-task"}, headers=AUTH)
    assert bad.status_code == 404 and ErrorResponse.model_validate_json(bad.content).error.param == "taskId"


def test_recording_costs_little_against_a_plain_completion_call(agent_server):
    """The same conversation through a session and through /v1/chat/completions, call for call (reported, loosely
    bounded: both are dominated by the engine, and the recorded call tokenises only the new messages)."""
    url = agent_server["url"]
    plain, recorded = client(f"{url}/v1"), session_client(open_session(url))
    histories = {name: [SYSTEM, {"role": "user", "content": "Fix calc.py: add() returns a - b."}] for name in "pr"}
    timings: dict[str, list[float]] = {"p": [], "r": []}
    for turn in range(6):
        for name, llm in (("p", plain), ("r", recorded)):
            started = time.perf_counter()
            answer = ask(llm, histories[name], seed=turn)
            timings[name].append(time.perf_counter() - started)
            histories[name] += [{"role": "assistant", "content": answer["content"]}, {"role": "tool", "content": "ok"}]
    plain_s, recorded_s = statistics.median(timings["p"]), statistics.median(timings["r"])
    print(f"\nper call (median of 6): plain {plain_s * 1000:.1f} ms, recorded {recorded_s * 1000:.1f} ms")
    assert recorded_s < 2 * plain_s + 0.1
