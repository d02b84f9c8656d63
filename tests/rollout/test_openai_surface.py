"""The OpenAI surface, driven by the official `openai` client against the rollout server's app (in process, a
seeded fake engine in place of vLLM): models, chat and completions streamed or not, with the same token ids,
log-probs and policy versions either way, usage, tools, and OpenAI-shaped errors for what is refused."""

from __future__ import annotations

import json
import random

import openai
import pytest
from fastapi.testclient import TestClient

from kuberl.modeling.chat import ChatFormat
from kuberl.rewards import resolve_reward
from kuberl.tokens import bearer, new_token
from kuberl_rollout.agent import Agent, EpisodeLimits
from kuberl_rollout.api import RolloutState, create_app
from kuberl_rollout.engine import Generation
from kuberl_rollout.metrics import RolloutMetrics
from kuberl_rollout.openai_chat import TOOL_SYNTAX
from kuberl_rollout.openai_stream import text_pieces
from kuberl_rollout.service import RolloutService
from kuberl_rollout.weights import BucketAssembler
from recipes.swe_toy.tiny_model import build_tokenizer

MODEL = "s3://models/tiny"
CONTEXT = 2048
SPECIAL = 6  # the tiny tokenizer's special tokens are ids 0-5 (<|end|>, its EOS, is 1)
CALL = '<tool_call>{"name": "read_file", "arguments": {"path": "calc.py"}}</tool_call>'
READ_FILE = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file of the repository.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
MESSAGES = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix calc.py"}]
TOKEN = new_token()


class FakeEngine:
    """Seeded sampling without a model: the same prompt and seed give the same tokens and log-probs. Texts put
    in `script` are generated in turn instead (a tool call, multi-byte characters); `fail` makes it raise."""

    dead = False

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.version = tokenizer, 3
        self.script: list[str] = []
        self.prompts: list[list[int]] = []
        self.max_tokens: list[int] = []
        self.fail: Exception | None = None

    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, stop_token_ids=None, seed=None):
        if len(prompt_ids) > CONTEXT:  # as vLLM refuses it
            raise ValueError(f"The decoder prompt (length {len(prompt_ids)}) is longer than the maximum model length")
        if self.fail is not None:
            raise self.fail
        self.prompts.append(list(prompt_ids))
        self.max_tokens.append(max_tokens)
        rng = random.Random(hash((tuple(prompt_ids), seed)) if seed is not None else None)
        if self.script:
            ids = self.tokenizer.encode(self.script.pop(0), add_special_tokens=False)
        else:  # any ordinary token, lone bytes of multi-byte characters included
            ids = [rng.randrange(SPECIAL, len(self.tokenizer)) for _ in range(rng.randint(8, 40))]
        ids, finish = [*ids, self.tokenizer.eos_token_id], "stop"
        if len(ids) > max_tokens:
            ids, finish = ids[:max_tokens], "length"
        logprobs = [-3 * rng.random() for _ in ids]
        return Generation(ids, logprobs, [self.version] * len(ids), finish)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tasks=20)


@pytest.fixture
def server(tokenizer):
    """(the official client, the fake engine, the raw HTTP client) against an in-process rollout server."""
    engine = FakeEngine(tokenizer)

    async def build_state() -> RolloutState:
        agent = Agent(engine, ChatFormat(tokenizer), "unused", EpisodeLimits())
        service = RolloutService(agent, object, resolve_reward("swe-toy-tests"), {}, 1, RolloutMetrics())
        return RolloutState(service, service.metrics, MODEL, "wait", BucketAssembler({}), CONTEXT)

    with TestClient(create_app(build_state, TOKEN), base_url="http://rollout", headers=bearer(TOKEN)) as http:
        client = openai.OpenAI(base_url="http://rollout/v1", api_key=TOKEN, http_client=http, max_retries=0)
        yield client, engine, http


def extra(obj, name):
    """A field of ours on an object of the official client (it keeps unknown fields)."""
    return getattr(obj, name)


def joined(lists) -> list:
    return [x for part in lists for x in part]


# ------------------------------------------------------------------------------------------------ models
def test_models_lists_the_served_model_with_its_policy_version(server):
    client, engine, _ = server
    (card,) = client.models.list().data
    assert (card.id, card.object, card.owned_by, extra(card, "policy_version")) == (MODEL, "model", "kuberl", 3)
    engine.version = 4
    assert extra(client.models.retrieve(MODEL), "policy_version") == 4
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4o")


# -------------------------------------------------------------------------------------------------- chat
def test_a_chat_completion_carries_ids_logprobs_versions_and_usage(server, tokenizer):
    client, engine, _ = server
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=7, max_tokens=64)
    choice = answer.choices[0]
    ids = extra(choice, "token_ids")
    assert extra(answer, "prompt_token_ids") == ChatFormat(tokenizer).prompt_ids(MESSAGES) == engine.prompts[-1]
    assert choice.message.role == "assistant" and choice.message.content == tokenizer.decode(
        ids, skip_special_tokens=True
    )
    assert ids[-1] == tokenizer.eos_token_id and choice.finish_reason == "stop"
    assert [t.token for t in choice.logprobs.content] == [tokenizer.decode([t]) for t in ids]
    assert extra(choice, "policy_versions") == [3] * len(ids)
    prompt = len(engine.prompts[-1])
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        prompt,
        len(ids),
        prompt + len(ids),
    )
    short = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=7, max_completion_tokens=4)
    assert short.usage.completion_tokens == 4 and short.choices[0].finish_reason == "length"


def test_a_chat_call_without_max_tokens_may_fill_the_context_and_the_legacy_one_gets_16(server):
    client, engine, _ = server
    engine.script = ["word " * 300]  # longer than any fixed default short of the context
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES)
    prompt = len(engine.prompts[-1])
    assert engine.max_tokens[-1] == CONTEXT - prompt  # as OpenAI and vLLM: what the context has left
    assert answer.choices[0].finish_reason == "stop" and answer.usage.completion_tokens > 300
    client.completions.create(model=MODEL, prompt="def f(x):")
    assert engine.max_tokens[-1] == 16  # OpenAI's default for the legacy endpoint


def test_a_streamed_chat_completion_records_what_the_plain_answer_carries(server):
    client, _, _ = server
    for seed in range(4):  # random tokens: lone bytes of multi-byte characters among them
        plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=seed).choices[0]
        stream = client.chat.completions.create(
            model=MODEL, messages=MESSAGES, seed=seed, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert [c.object for c in chunks] == ["chat.completion.chunk"] * len(chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        choices = [c.choices[0] for c in chunks if c.choices]
        assert "".join(c.delta.content or "" for c in choices) == plain.message.content
        assert joined(extra(c, "token_ids") for c in choices) == extra(plain, "token_ids")
        assert joined(extra(c, "policy_versions") for c in choices) == extra(plain, "policy_versions")
        streamed_logprobs = [t for c in choices if c.logprobs for t in c.logprobs.content]
        assert [(t.token, t.logprob) for t in streamed_logprobs] == [
            (t.token, t.logprob) for t in plain.logprobs.content
        ]
        assert [c.finish_reason for c in choices if c.finish_reason] == [plain.finish_reason]
        usage = chunks[-1].usage
        assert chunks[-1].choices == [] and usage.completion_tokens == len(extra(plain, "token_ids"))
        assert all(c.usage is None for c in chunks[:-1])


def test_the_first_chunk_carries_the_prompt_ids_and_usage_comes_only_when_asked(server):
    client, _, _ = server
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=1)
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, seed=1, stream=True))
    assert extra(chunks[0], "prompt_token_ids") == extra(plain, "prompt_token_ids")
    assert all(c.choices and c.usage is None for c in chunks)


def test_streamed_text_splits_only_between_whole_characters(server, tokenizer):
    client, engine, _ = server
    text = "Füße, naïve café 🙂 — ok"
    engine.script = [text, text]
    plain = client.chat.completions.create(model=MODEL, messages=MESSAGES).choices[0]
    pieces = [
        c.choices[0].delta.content for c in client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    ]
    assert plain.message.content == "".join(p or "" for p in pieces) == text
    assert not any("\ufffd" in (p or "") for p in pieces)
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # characters are split across tokens
    assert "".join(text_pieces(tokenizer, ids)) == text


def test_the_stream_helper_of_the_client_assembles_the_answer(server):
    client, engine, _ = server
    engine.script = ["I will look. " + CALL]
    with client.chat.completions.stream(model=MODEL, messages=MESSAGES, tools=[READ_FILE]) as stream:
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "I will look. " + CALL and final.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    assert call.function.name == "read_file" and json.loads(call.function.arguments) == {"path": "calc.py"}


# ------------------------------------------------------------------------------------------- completions
def test_completions_stream_the_same_ids_and_logprobs(server, tokenizer):
    client, _, _ = server
    prompt = "def add(a, b):"
    plain = client.completions.create(model=MODEL, prompt=prompt, seed=5, max_tokens=32)
    chunks = list(
        client.completions.create(
            model=MODEL, prompt=prompt, seed=5, max_tokens=32, stream=True, stream_options={"include_usage": True}
        )
    )
    choice = plain.choices[0]
    assert extra(plain, "prompt_token_ids") == tokenizer.encode(prompt, add_special_tokens=False)
    assert extra(chunks[0], "prompt_token_ids") == extra(plain, "prompt_token_ids")
    choices = [c.choices[0] for c in chunks if c.choices]
    assert "".join(c.text for c in choices) == choice.text
    assert joined(extra(c, "token_ids") for c in choices) == extra(choice, "token_ids")
    assert joined(c.logprobs.token_logprobs for c in choices) == choice.logprobs.token_logprobs
    assert [c.finish_reason for c in choices if c.finish_reason] == [choice.finish_reason]
    assert chunks[-1].usage == plain.usage and plain.usage.completion_tokens == len(extra(choice, "token_ids"))
    by_ids = client.completions.create(model=MODEL, prompt=extra(plain, "prompt_token_ids"), seed=5, max_tokens=32)
    assert extra(by_ids.choices[0], "token_ids") == extra(choice, "token_ids")  # ids in, the same ids out


# ------------------------------------------------------------------------------------------------- tools
def test_a_tool_call_round_trips_through_the_official_client(server, tokenizer):
    client, engine, _ = server
    engine.script = [CALL, "Fixed."]
    messages: list = list(MESSAGES)
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[READ_FILE], tool_choice="auto")
    choice = first.choices[0]
    (call,) = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == (
        "function",
        "read_file",
        {"path": "calc.py"},
    )
    assert choice.finish_reason == "tool_calls" and choice.message.content == CALL
    # the tiny model's template ignores `tools`: they are described in the system message, in the parser's syntax
    shown = tokenizer.decode(engine.prompts[0])
    assert shown.startswith("<|system|>You fix bugs.\n\n" + TOOL_SYNTAX) and '"name": "read_file"' in shown
    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": "def add(a, b): return a - b"}]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=[READ_FILE])
    assert second.choices[0].message.content == "Fixed." and second.choices[0].message.tool_calls is None
    # sent back, the answer renders as the text that was generated, followed by the tool's output
    generated = tokenizer.decode(extra(first, "prompt_token_ids") + extra(choice, "token_ids"))
    assert tokenizer.decode(engine.prompts[1]).startswith(generated + "<|tool|>def add(a, b): return a - b<|end|>")


def test_a_streamed_tool_call_comes_in_a_delta(server):
    client, engine, _ = server
    engine.script = [CALL]
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[READ_FILE], stream=True))
    calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert [(t.index, t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        (0, "read_file", {"path": "calc.py"})
    ]
    assert calls[0].id.startswith("call_") and chunks[-1].choices[0].finish_reason == "tool_calls"


NATIVE_TEMPLATE = (
    "{% if tools %}<|system|>TOOLS {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}"
    "<|end|>{% endif %}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}<tool_call>{{ c.function.name }}({{ c.function.arguments | tojson }})"
    "</tool_call>{% endfor %}"
    "<|end|>{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture
def native_tools(tokenizer):
    """The tokenizer with a chat template that renders tools itself (as tool-trained models' templates do)."""
    plain, tokenizer.chat_template = tokenizer.chat_template, NATIVE_TEMPLATE
    yield
    tokenizer.chat_template = plain


def test_a_template_that_renders_tools_gets_them_and_each_call_once(server, tokenizer, native_tools):
    client, engine, _ = server
    engine.script = [CALL, "Fixed."]
    first = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[READ_FILE])
    shown = tokenizer.decode(engine.prompts[0])
    assert shown.startswith("<|system|>TOOLS read_file<|end|>") and TOOL_SYNTAX not in shown
    message = first.choices[0].message
    client.chat.completions.create(
        model=MODEL, messages=[*MESSAGES, message, {"role": "tool", "content": "ok"}], tools=[READ_FILE]
    )
    rendered = tokenizer.decode(engine.prompts[1])
    # the call as the template writes it (arguments an object), not also as generated: the markup is left out
    assert rendered.count("<tool_call>") == 1 and '<tool_call>read_file({"path": "calc.py"})</tool_call>' in rendered


def test_tool_choice_none_returns_text_only(server):
    client, engine, _ = server
    engine.script = [CALL]
    answer = client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[READ_FILE], tool_choice="none")
    assert answer.choices[0].message.tool_calls is None and answer.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "read_file"}}])
def test_a_tool_choice_that_cannot_be_honoured_is_a_bad_request(server, choice):
    client, engine, _ = server
    with pytest.raises(openai.BadRequestError, match="tool_choice can be 'auto' or 'none'") as refused:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, tools=[READ_FILE], tool_choice=choice)
    assert (refused.value.param, refused.value.code, refused.value.type) == (
        "tool_choice",
        "unsupported_value",
        "invalid_request_error",
    )
    assert engine.prompts == []  # refused before anything was generated


# ------------------------------------------------------------------------------------------------ errors
LONG = "x " * 3000
BAD = [
    ("/chat/completions", {"messages": []}, "messages", "at least 1 item"),
    ("/chat/completions", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role", "'system'"),
    ("/chat/completions", {"messages": MESSAGES, "temperature": -1}, "temperature", "greater than or equal to 0"),
    ("/chat/completions", {"messages": MESSAGES, "max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
    ("/chat/completions", {"messages": MESSAGES, "n": 2}, "n", "n must be 1"),
    ("/chat/completions", {"messages": MESSAGES, "stop": ["\n"]}, "stop", "stop sequences are not supported"),
    ("/chat/completions", {"messages": MESSAGES, "top_logprobs": 3}, "top_logprobs", "not supported"),
    ("/chat/completions", {"messages": MESSAGES, "frequency_penalty": 0.5}, "frequency_penalty", "not supported"),
    (
        "/chat/completions",
        {"messages": MESSAGES, "response_format": {"type": "json_object"}},
        "response_format",
        "no constrained decoding",
    ),
    (
        "/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content",
        "'image_url' are not supported",
    ),
    (
        "/chat/completions",
        {
            "messages": [
                *MESSAGES,
                {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}]},
            ]
        },
        "messages[2].tool_calls[0].function.arguments",
        "is not JSON",
    ),
    ("/chat/completions", {"messages": MESSAGES, "tools": [{"type": "web_search"}]}, "tools[0].type", "'function'"),
    ("/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, "messages", "maximum model length"),
    ("/completions", {"max_tokens": 2}, "prompt", "Field required"),
    ("/completions", {"prompt": [10**7], "max_tokens": 2}, "prompt", "token ids must lie in"),
    ("/completions", {"prompt": []}, "prompt", "prompt is empty"),
    ("/completions", {"prompt": "x", "echo": True}, "echo", "prompt_token_ids"),
    ("/completions", {"prompt": "x", "logprobs": 2}, "logprobs", "top alternatives are not supported"),
]


@pytest.mark.parametrize(("path", "body", "param", "words"), BAD, ids=[f"{b[0]} {b[2]}" for b in BAD])
def test_bad_input_is_a_400_in_openais_shape_naming_the_field(server, path, body, param, words):
    _, engine, http = server
    response = http.post("/v1" + path, json={"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert list(response.json()) == ["error"] and list(error) == ["message", "type", "param", "code"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and words in error["message"]
    assert engine.prompts == []
    assert http.get("/readyz").status_code == 200


def test_a_body_that_is_not_json_is_a_400(server):
    _, _, http = server
    response = http.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]


def test_the_official_client_raises_with_the_message(server):
    client, _, _ = server
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        client.chat.completions.create(model=MODEL, messages=MESSAGES, n=2)
    with pytest.raises(openai.NotFoundError, match="Responses API is not served here"):
        client.responses.create(model=MODEL, input="hi")


def test_an_engine_failure_is_a_503_not_a_500(server):
    client, engine, _ = server
    engine.fail = RuntimeError("EngineCore died")
    with pytest.raises(openai.InternalServerError, match="generation failed: EngineCore died") as failed:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
    assert failed.value.status_code == 503 and failed.value.type == "server_error"


def test_a_loading_server_answers_503_in_openais_shape(tokenizer):
    async def never():
        raise AssertionError("not started")

    http = TestClient(create_app(never, TOKEN), base_url="http://rollout")  # no lifespan: the engine is "loading"
    client = openai.OpenAI(base_url="http://rollout/v1", api_key=TOKEN, http_client=http, max_retries=0)
    with pytest.raises(openai.InternalServerError, match="still loading") as loading:
        client.models.list()
    assert loading.value.status_code == 503


def test_the_work_api_keeps_its_own_error_shape(server):
    _, _, http = server
    response = http.post("/v1/groups", json={"groupSize": 2})
    assert response.status_code == 422 and list(response.json()) == ["detail"]
