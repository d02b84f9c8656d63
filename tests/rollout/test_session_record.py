"""The token record of a recorded session, without a server: which calls reuse the previous call's ids, which
start a new segment, and the trajectory the record makes."""

from __future__ import annotations

import pytest

from kuberl.api.openai_http import ChatRequest
from kuberl.modeling.chat import ChatFormat
from kuberl_rollout.engine import Generation
from kuberl_rollout.openai_chat import prompt_text
from kuberl_rollout.recorded_sessions import SessionStore
from recipes.swe_toy.tiny_model import build_tokenizer

PAD, END = 0, 1  # the tiny tokenizer's special tokens: the answer's content leaves them out


@pytest.fixture(scope="module")
def chat():
    return ChatFormat(build_tokenizer(tasks=20))


def generation(chat, text: str, *, pad_inside: bool = False, ended: bool = True) -> Generation:
    ids = chat.tokenizer.encode(text, add_special_tokens=False)
    if pad_inside:
        ids = [*ids[:2], PAD, *ids[2:]]
    ids += [END] if ended else []
    return Generation(ids, [-0.5] * len(ids), [7] * len(ids), "stop" if ended else "length")


def call(session, chat, messages, gen):
    """Record one call; the answer as the agent gets it (the assistant message it sends back)."""
    prompt = session.prompt(prompt_text(chat, ChatRequest(messages=messages)))
    session.record(prompt, gen, 0.01)
    content = chat.tokenizer.decode(gen.token_ids, skip_special_tokens=True)
    return prompt, {"role": "assistant", "content": content}


@pytest.mark.parametrize(
    ("pad_inside", "ended"), [(False, True), (True, True), (False, False)], ids=["plain", "special-inside", "cut"]
)
def test_each_call_reuses_the_previous_calls_ids(chat, pad_inside, ended):
    session = SessionStore(chat.tokenizer).open("http://rollout", None, None)
    messages = [{"role": "system", "content": "You fix bugs."}, {"role": "user", "content": "Fix calc.py"}]
    first_gen = generation(chat, "read calc.py", pad_inside=pad_inside, ended=ended)
    first, answer = call(session, chat, messages, first_gen)
    messages += [answer, {"role": "tool", "content": "def add(a, b): return a - b"}]
    second, _ = call(session, chat, messages, generation(chat, "replace - with +"))

    assert second.reused == len(first.ids) + len(first_gen.token_ids) and not second.new_segment
    t = session.trajectory(1.0, "submitted", [])
    assert t.token_ids[: second.reused] == first.ids + first_gen.token_ids
    assert t.history_mismatches == 0 and [turn.start for turn in t.turns] == [len(first.ids), len(second.ids)]
    assert t.turns[0].end == len(second.ids)  # the new messages are the first turn's observation
    assert sum(t.loss_mask) == len(first_gen.token_ids) + len(generation(chat, "replace - with +").token_ids)


def test_an_edited_history_starts_a_counted_segment_and_the_last_one_is_trained(chat):
    session = SessionStore(chat.tokenizer).open("http://rollout", None, "g")
    messages = [{"role": "user", "content": "Fix calc.py"}]
    call(session, chat, messages, generation(chat, "read calc.py"))
    edited = [*messages, {"role": "assistant", "content": "(summary)"}, {"role": "user", "content": "go on"}]
    prompt, _ = call(session, chat, edited, generation(chat, "submit"))
    assert prompt.new_segment and prompt.reused == 0
    info = session.describe()
    assert (info.segments, info.history_mismatches, info.calls) == (2, 1, 2)
    t = session.trajectory(0.0, "submitted", [])
    assert (t.prompt_length, t.history_mismatches, t.group_id) == (len(prompt.ids), 1, "g")
