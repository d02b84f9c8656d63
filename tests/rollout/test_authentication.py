"""Who may call a rollout server (in process, a fake engine in place of vLLM): every route of the app but the
probes and /metrics refuses a caller without the job token with a 401 in its own error shape, before anything
is done; a recorded session's routes take that session's own API key and no other session's; the probes and
/metrics answer anyone and show no token."""

from __future__ import annotations

import re

import openai
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from starlette.routing import Route

from kuberl.api.agents import AgentEnvironment
from kuberl.api.sessions_http import OpenedSession, OpenSession
from kuberl.modeling.chat import ChatFormat
from kuberl.rewards import resolve_reward
from kuberl.suites.swe_toy import generate
from kuberl.tokens import bearer, new_token
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.api import RolloutState, create_app
from kuberl_rollout.engine import Generation
from kuberl_rollout.external_agent import EpisodeEnvironment
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.recorded_sessions import SessionStore
from kuberl_rollout.service import RolloutService
from kuberl_rollout.weights import BucketAssembler
from recipes.swe_toy.tiny_model import build_tokenizer

TOKEN = new_token()
TASK = generate(1, seed=3)[0]
OPEN = {"/healthz", "/readyz", "/metrics"}
"""Routes anyone may call: the kubelet's probes and Prometheus."""
SCHEMA = {"/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"}
"""FastAPI's description of the API: no state, no secret."""
WRONG = {
    "no header": {},
    "a wrong token": bearer(new_token()),
    "the token without its scheme": {"Authorization": TOKEN},
    "the token as Basic": {"Authorization": f"Basic {TOKEN}"},
    "an empty bearer": {"Authorization": "Bearer "},
}


class FakeEngine:
    """Answers every prompt with three tokens; counts what it was asked."""

    dead = False
    version = 0

    def __init__(self, eos: int) -> None:
        self.eos, self.calls = eos, 0

    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        self.calls += 1
        ids = [7, 8, self.eos][:max_tokens]
        return Generation(ids, [-0.5] * len(ids), [self.version] * len(ids), "stop")

    async def update_weights(self, files, version, mode) -> None:
        raise AssertionError("no weights reach the engine in these tests")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tasks=20)


@pytest.fixture
def server(tokenizer):
    """(the app, a raw client without credentials, the service)."""
    made = {}

    async def build_state() -> RolloutState:
        agent = Agent(FakeEngine(tokenizer.eos_token_id), ChatFormat(tokenizer), "unused", EpisodeLimits())
        service = RolloutService(
            agent, object, resolve_reward("swe-toy-tests"), {TASK.task_id: TASK}, 1, RolloutMetrics()
        )
        made["service"] = service
        return RolloutState(service, service.metrics, "tiny", "wait", BucketAssembler({"w": (2, 3)}), 2048)

    app = create_app(build_state, TOKEN)
    with TestClient(app, base_url="http://rollout") as http:
        yield app, http, made["service"]


def open_session(http: TestClient) -> OpenedSession:
    answer = http.post("/v1/sessions", json=OpenSession(task_id=TASK.task_id).wire(), headers=bearer(TOKEN))
    assert answer.status_code == 201, answer.text
    return OpenedSession.model_validate_json(answer.content)


def calls_of(app, session_id: str) -> list[tuple[str, str]]:
    """(method, path) of every route of the app, its path parameters filled in (`session_id` for sessions)."""
    values = {"session_id": session_id, "version": "1", "index": "0"}
    out = []
    for route in app.routes:
        assert isinstance(route, Route), f"{route!r}: a route the test cannot check"
        if route.path in SCHEMA:
            continue
        path = re.sub(r"{(\w+)(:\w+)?}", lambda m: values.get(m.group(1), "x"), route.path)
        out += [(method, path) for method in sorted(route.methods - {"HEAD"})]
    return out


def test_every_route_but_the_probes_and_metrics_refuses_a_caller_without_the_job_token(server, tokenizer):
    app, http, service = server
    victim = open_session(http)
    calls = [c for c in calls_of(app, victim.id) if c[1] not in OPEN]
    assert len(calls) >= 20 and all(isinstance(r, APIRoute) for r in app.routes if r.path not in SCHEMA)
    for method, path in calls:
        for why, headers in WRONG.items():
            body = b"\x00" * 64 if method == "PUT" else b"{}"
            response = http.request(method, path, content=body, headers={"Content-Type": "application/json", **headers})
            assert response.status_code == 401, f"{method} {path} with {why}: {response.status_code} {response.text}"
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert TOKEN not in response.text and victim.api_key not in response.text
            message = response.json().get("detail") or response.json()["error"]["message"]
            assert "token" in message or "API key" in message, f"{method} {path}: {message}"
    # nothing was done for any of them
    assert service.groups == {} and service.agent.engine.calls == 0 and service.agent.engine.version == 0
    assert not service.sessions.get(victim.id).closed and service.sessions.get(victim.id).calls == 0
    assert len(service.sessions.open_sessions) == 1


def test_the_job_token_opens_the_control_routes(server):
    _, http, _ = server
    authorized = {"headers": bearer(TOKEN)}
    accepted = http.post("/v1/groups", json={"taskId": TASK.task_id, "groupSize": 1}, **authorized)
    assert accepted.status_code == 202, accepted.text
    assert http.get(f"/v1/groups/{accepted.json()['groupId']}", **authorized).status_code == 200
    assert http.get("/v1/policy", **authorized).json()["version"] == 0
    assert http.get("/v1/models", **authorized).status_code == 200


def test_the_work_api_refuses_in_its_problem_shape_and_openai_routes_in_openais(server):
    _, http, _ = server
    work = http.post("/v1/groups", json={"taskId": TASK.task_id, "groupSize": 1})
    assert work.status_code == 401 and work.json() == {"detail": work.json()["detail"]}
    llm = openai.OpenAI(base_url="http://rollout/v1", api_key=new_token(), http_client=http, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="job token"):
        llm.models.list()


def test_a_session_opens_with_a_fresh_api_key_that_opens_its_own_routes_only(server):
    _, http, service = server
    mine, theirs = open_session(http), open_session(http)
    assert mine.api_key != theirs.api_key and len(mine.api_key) >= 40
    assert mine.api_key not in http.get(f"/v1/sessions/{mine.id}", headers=bearer(TOKEN)).text  # shown once
    llm = openai.OpenAI(base_url=mine.base_url, api_key=mine.api_key, http_client=http, max_retries=0)
    answer = llm.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].token_ids[:2] == [7, 8]
    # my key on their routes, and on the routes of the job
    borrowed = openai.OpenAI(base_url=theirs.base_url, api_key=mine.api_key, http_client=http, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="API key of session"):
        borrowed.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        borrowed.models.list()
    key = bearer(mine.api_key)
    assert http.get(f"/v1/sessions/{theirs.id}", headers=key).status_code == 401
    assert http.post(f"/v1/sessions/{theirs.id}/close", json={"reward": 1.0}, headers=key).status_code == 401
    assert http.post("/v1/sessions", json={}, headers=key).status_code == 401
    assert http.post("/v1/groups", json={"taskId": TASK.task_id, "groupSize": 1}, headers=key).status_code == 401
    assert http.get("/v1/models", headers=key).status_code == 401
    assert service.sessions.get(theirs.id).calls == 0 and not service.sessions.get(theirs.id).closed
    # the job token opens every session's routes (whoever opened the session may follow and close it)
    assert http.get(f"/v1/sessions/{theirs.id}", headers=bearer(TOKEN)).status_code == 200
    # a session's key still answers for it once it is closed: the caller learns it is closed, not unauthorized
    assert http.post(f"/v1/sessions/{mine.id}/close", json={"reward": 1.0}, headers=key).status_code == 200
    with pytest.raises(openai.ConflictError, match="closed"):
        llm.models.list()


def test_the_probes_and_metrics_answer_anyone_and_show_no_token(server):
    _, http, _ = server
    session = open_session(http)
    for path in sorted(OPEN | {"/openapi.json"}):
        response = http.get(path)
        assert response.status_code == 200, path
        assert TOKEN not in response.text and session.api_key not in response.text


def test_a_server_without_a_job_token_does_not_start():
    async def never():
        raise AssertionError("not started")

    with pytest.raises(ValueError, match="job token"):
        create_app(never, "")


def test_an_external_agent_gets_its_episode_sessions_key(tokenizer):
    store = SessionStore(tokenizer)
    session = store.open("http://rollout", TASK, None, episode=True)
    handle = EpisodeEnvironment(object(), "observation", session, EpisodeLimits())  # type: ignore[arg-type]
    assert isinstance(handle, AgentEnvironment)
    assert handle.api_key == session.api_key == store.api_key(session.id)
