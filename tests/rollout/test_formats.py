"""Tool-call syntax, the incremental chat format and weight-bucket checks (no engine needed)."""

from __future__ import annotations

import gc
import json

import pytest
import torch
from safetensors.torch import save

from kuberl.api.environment import ToolCall
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import ParseError, format_tool_call, parse_tool_call
from kuberl_rollout.weights import SHARED_MEMORY, BucketAssembler, WeightError, chunks_of
from recipes.swe_toy.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(tasks=40)


def test_tool_calls_round_trip():
    call = ToolCall(name="replace", arguments={"path": "a.py", "old": "a - b", "new": "a + b"})
    assert parse_tool_call("thinking... " + format_tool_call(call) + " trailing") == call


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("no call here", "no tool call found"),
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>["run_tests"]</tool_call>', 'needs a "name"'),
        ('<tool_call>{"name": "run", "arguments": 5}</tool_call>', "bad tool call"),
    ],
)
def test_malformed_tool_calls_become_error_observations(text, words):
    parsed = parse_tool_call(text)
    assert isinstance(parsed, ParseError) and parsed.message.startswith("error:") and words in parsed.message


def test_observation_ids_extend_the_conversation_exactly(tokenizer):
    """Appending prompt ids + generated ids + observation ids gives the ids of the whole conversation."""
    chat = ChatFormat(tokenizer)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "Fix calc.py"}]
    prompt = chat.prompt_ids(messages)
    generated = tokenizer.encode('<tool_call>{"name": "run_tests"}</tool_call>', add_special_tokens=False)
    generated.append(tokenizer.eos_token_id)
    observation = chat.observation_ids("FAILED (failures=1)\n[0/1 tests passed]")
    whole = [
        *messages,
        {"role": "assistant", "content": '<tool_call>{"name": "run_tests"}</tool_call>'},
        {"role": "tool", "content": "FAILED (failures=1)\n[0/1 tests passed]"},
    ]
    expected = tokenizer.apply_chat_template(whole, tokenize=False, add_generation_prompt=True)
    assert tokenizer.decode(prompt + generated + observation) == expected


def test_chatml_templates_split_too():
    from transformers import PreTrainedTokenizerFast

    chatml = PreTrainedTokenizerFast(tokenizer_object=build_tokenizer(tasks=10).backend_tokenizer, eos_token="<|end|>")
    chatml.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    assert ChatFormat(chatml)._affixes() == ("<|im_start|>tool\n", "<|im_end|>\n<|im_start|>assistant\n")


def blob(**tensors):
    return save({k: v.contiguous() for k, v in tensors.items()})


@pytest.mark.parametrize(
    ("version", "index", "count", "data", "words"),
    [
        (3, 0, 1, blob(**{"w.a": torch.zeros(2, 3)}), "not newer than the served version 3"),
        (4, 2, 2, blob(**{"w.a": torch.zeros(2, 3)}), "bucket 2 of 2 does not exist"),
        (4, 0, 1, blob(**{"w.z": torch.zeros(2, 3)}), "unknown weight 'w.z'"),
        (4, 0, 1, blob(**{"w.a": torch.zeros(3, 2)}), "has shape [3, 2], expected [2, 3]"),
        (4, 0, 1, b"garbage", "not a safetensors blob"),
    ],
)
async def test_bad_weight_buckets_are_refused(version, index, count, data, words, tmp_path):
    assembler = BucketAssembler({"w.a": (2, 3), "w.b": (4,)}, staging=tmp_path)
    with pytest.raises(WeightError) as err:
        await assembler.stage(version, index, count, chunks_of(data), current=3)
    assert words in str(err.value)
    assert list(tmp_path.iterdir()) == []  # a refused bucket leaves no staged file


def _with_header(data: bytes, edit) -> bytes:
    """`data` with its safetensors header changed by `edit` (a function of the parsed header)."""
    size = int.from_bytes(data[:8], "little")
    header = edit(json.loads(data[8 : 8 + size]))
    encoded = json.dumps(header).encode()
    return len(encoded).to_bytes(8, "little") + encoded + data[8 + size :]


def _set(header: dict, name: str, key: str, value) -> dict:
    header[name][key] = value
    return header


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"\x05\x00", "shorter than the 8-byte header length"),
        ((10**9).to_bytes(8, "little") + b"{}", "does not fit a blob"),
        (b"\x03" + bytes(7) + b"abc", "header is not JSON"),
        (blob(**{"w.a": torch.zeros(2, 3)}) + b"tail", "the tensors take 24 bytes, the blob carries 28"),
        (_with_header(blob(**{"w.a": torch.zeros(2, 3)}), lambda h: _set(h, "w.a", "dtype", "C64")), "dtype 'C64'"),
        (
            _with_header(blob(**{"w.a": torch.zeros(2, 3)}), lambda h: _set(h, "w.a", "shape", [2, 2])),
            "24 bytes for F32 of shape [2, 2]",
        ),
        (_with_header(blob(**{"w.a": torch.zeros(2, 3)}), lambda h: _set(h, "w.a", "data_offsets", "x")), "expected"),
        (
            _with_header(blob(**{"w.a": torch.zeros(2, 3)}), lambda h: _set(h, "w.a", "data_offsets", ["0", 24])),
            "bad shape",
        ),
        (
            _with_header(
                blob(**{"w.a": torch.zeros(2, 3), "w.b": torch.zeros(6)}),
                lambda h: _set(h, "w.b", "data_offsets", h["w.a"]["data_offsets"]),
            ),
            "gap or overlap",
        ),
    ],
    ids=[
        "short",
        "huge-header",
        "not-json",
        "trailing-bytes",
        "dtype",
        "shape-vs-bytes",
        "offsets",
        "offset-type",
        "overlap",
    ],
)
async def test_a_bucket_is_checked_from_its_header_alone(data, words, tmp_path):
    """A corrupt header is refused before any byte of it reaches the engine (whose decoder would crash)."""
    assembler = BucketAssembler({"w.a": (2, 3), "w.b": (6,)}, staging=tmp_path)
    with pytest.raises(WeightError, match="not a safetensors blob") as err:
        await assembler.stage(4, 0, 1, chunks_of(data, 3), current=3)
    assert words in str(err.value)
    assert list(tmp_path.iterdir()) == []


async def test_buckets_assemble_into_one_version_as_the_bytes_that_arrived(tmp_path):
    assembler = BucketAssembler({"w.a": (2, 3), "w.b": (4,)}, staging=tmp_path)
    first, second = blob(**{"w.a": torch.ones(2, 3)}), blob(**{"w.b": torch.ones(4)})
    assert not await assembler.stage(4, 1, 2, chunks_of(second, 5), current=0)
    assert await assembler.stage(4, 0, 2, chunks_of(first, 5), current=0)
    files = assembler.take()
    assert [f.read_bytes() for f in files] == [first, second]  # in bucket order, never decoded and encoded again
    assembler.discard()
    assert not any(f.exists() for f in files)
    await assembler.stage(5, 0, 1, chunks_of(blob(**{"w.a": torch.ones(2, 3)})), current=4)
    with pytest.raises(WeightError, match="lacks 1 weights"):
        assembler.take()
    assert list(tmp_path.iterdir()) == []  # an incomplete version is not kept either
    with pytest.raises(WeightError, match="announced with 2 buckets, now 3"):
        await assembler.stage(6, 0, 2, chunks_of(first), current=4)
        await assembler.stage(6, 1, 3, chunks_of(second), current=4)


def test_staged_buckets_live_in_shared_memory_where_there_is_one():
    assembler = BucketAssembler({"w.a": (2, 3)})
    staging = assembler.staging
    assert staging.is_dir() and (staging.parent == SHARED_MEMORY or not SHARED_MEMORY.is_dir())
    del assembler
    gc.collect()
    assert not staging.exists()  # removed with its assembler
