"""The warm-up stage: supervised fine-tuning on a demonstrations dataset (JSONL of chat messages), its token
layout, its landing check, and the refusal of the fields it replaced."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import with_spec
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.api.demonstrations import Demonstration
from kuberl.api.environment import ToolCall
from kuberl.api.rljob import RLJob
from kuberl.demonstration_files import read_demonstrations
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, format_tool_call, parse_tool_call
from kuberl.suites import load_tasks
from kuberl_trainer.demonstrations import demonstration_tokens
from kuberl_trainer.warmup import demonstration_probability, warm_up
from recipes.swe_toy.tiny_model import build_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("warmup") / "model", hidden_size=64, layers=2, seed=3)


def call(name: str, **arguments) -> str:
    return format_tool_call(ToolCall(name=name, arguments=arguments))


def demonstration(task, solved: bool, slip: bool = False) -> dict:
    """A swe-toy episode written by hand (no sandbox): the tests, the edit (the fix or the buggy text copied
    back), the tests again, submit; with `slip`, a call cut short first, shown with its error."""
    meta = task.metadata
    edit = call("replace", path=meta["file"], old=meta["buggy"], new=meta["fix"] if solved else meta["buggy"])
    messages = [
        {"role": "system", "content": SWE_SYSTEM_PROMPT},
        {"role": "user", "content": task.prompt},
        {"role": "assistant", "content": call("run_tests")},
        {"role": "tool", "content": f"FAILED: expected {meta['fix']}, the code has {meta['buggy']}"},
    ]
    if slip:
        messages += [
            {"role": "assistant", "content": edit[:20], "train": False},
            {"role": "tool", "content": "error: the call is not closed"},
        ]
    messages += [
        {"role": "assistant", "content": edit},
        {"role": "tool", "content": "replaced 1 occurrence"},
        {"role": "assistant", "content": call("run_tests")},
        {"role": "tool", "content": "passed" if solved else "FAILED"},
        {"role": "assistant", "content": call("submit")},
    ]
    return {"taskId": task.task_id, "messages": messages, "reward": 1.0 if solved else 0.0}


def write_dataset(path, count: int = 16, solved_every: int = 2) -> str:
    tasks = load_tasks("swe-toy", split="train", count=64)
    lines = [json.dumps(demonstration(tasks[i], i % solved_every == 0, slip=i % 3 == 0)) for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def warmup_job(demonstrations: str, **warmup) -> RLJob:
    fields = {"demonstrations": demonstrations, "steps": 10, "learningRate": 5e-3, "batchSize": 4, **warmup}
    return RLJob.model_validate(with_spec(training={"seed": 2, "warmup": fields}))


def test_tokens_follow_the_rollout_layout_and_train_only_the_demonstrated_calls(tiny, tmp_path):
    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny))
    demo = read_demonstrations(write_dataset(tmp_path / "d.jsonl", count=1))[0]  # line 0 has a slip
    tokens = demonstration_tokens(demo, chat)
    eos = chat.tokenizer.eos_token_id
    expected_ids = chat.prompt_ids([{"role": m.role, "content": m.content} for m in demo.messages[:2]])
    expected_mask = [0] * len(expected_ids)
    for message in demo.messages[2:]:
        if message.role == "assistant":
            piece = [*chat.tokenizer.encode(message.content, add_special_tokens=False), eos]
            expected_mask += [int(message.train)] * len(piece)
        else:
            piece = chat.observation_ids(message.content)
            expected_mask += [0] * len(piece)
        expected_ids += piece
    assert tokens.token_ids == expected_ids and tokens.loss_mask == expected_mask
    trained = chat.tokenizer.decode([t for t, m in zip(tokens.token_ids, tokens.loss_mask, strict=True) if m])
    assert trained.count("run_tests") == 2 and trained.count("replace") == 1 and "submit" in trained
    assert not demo.messages[4].train and "error" not in trained  # the slip and every answer: context only


def test_a_bad_line_is_refused_naming_the_file_the_line_and_the_field(tmp_path):
    good = demonstration(load_tasks("swe-toy", split="train", count=8)[0], True)
    bad = {**good, "messages": [good["messages"][0], good["messages"][2]]}  # no user message
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(good) + "\n\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"d\.jsonl line 3: .*user message"):
        read_demonstrations(str(path))
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"line 1: not valid JSON"):
        read_demonstrations(str(path))
    with pytest.raises(ValueError, match=r"spec.training.warmup.demonstrations file .*nowhere.jsonl"):
        read_demonstrations(str(tmp_path / "nowhere.jsonl"))


@pytest.mark.parametrize(
    ("roles", "problem"),
    [
        (["user", "tool"], "expected role assistant"),
        (["user", "assistant", "assistant"], "expected role tool"),
        (["system", "assistant"], "user message"),
    ],
)
def test_messages_must_alternate_after_the_prompt(roles, problem):
    with pytest.raises(ValidationError, match=problem):
        Demonstration.model_validate({"taskId": "t", "messages": [{"role": r, "content": "x"} for r in roles]})


def test_a_demonstration_with_nothing_to_train_on_is_refused():
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a", "train": False}]
    with pytest.raises(ValidationError, match="no assistant message to train on"):
        Demonstration.model_validate({"taskId": "t", "messages": messages})


def test_a_dataset_on_s3_is_read_like_a_file(tmp_path, monkeypatch):
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.setenv(key, "test")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        boto3.client("s3").create_bucket(Bucket="data")
        boto3.client("s3").upload_file(write_dataset(tmp_path / "d.jsonl", count=3), "data", "warm/d.jsonl")
        assert [d.task_id for d in read_demonstrations("s3://data/warm/d.jsonl")] == [
            d.task_id for d in read_demonstrations(str(tmp_path / "d.jsonl"))
        ]
        with pytest.raises(ValueError, match=r"s3://data/missing\.jsonl: cannot download it"):
            read_demonstrations("s3://data/missing.jsonl")
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("warmup", "replacement"),
    [
        ({"demonstrations": 1200}, "now the demonstrations file"),
        ({"expertFraction": 0.5}, "--expert-fraction"),
        ({"wrongEdit": "unchanged"}, "--wrong-edit"),
        ({"recoveryFraction": 0.3}, "--recovery-fraction"),
        ({"landing": {"minCorrectEdit": 0.35}}, "replaced by landing.min"),
        ({"landing": {"probeTasks": 8}}, "replaced by landing.probeDemonstrations"),
    ],
)
def test_the_fields_the_dataset_replaced_are_refused_with_what_replaced_them(warmup, replacement):
    with pytest.raises(ValidationError, match=replacement) as caught:
        RLJob.model_validate(with_spec(training={"warmup": warmup}))
    assert "spec.training.warmup" in str(caught.value)


def test_a_landing_range_upside_down_is_refused():
    with pytest.raises(ValidationError, match="must be at least min"):
        RLJob.model_validate(with_spec(training={"warmup": {"landing": {"min": 0.6, "max": 0.4}}}))


@pytest.mark.slow
def test_a_short_warm_up_makes_a_tiny_model_call_tools(tiny, tmp_path):
    job = warmup_job(write_dataset(tmp_path / "d.jsonl"), steps=80)
    stats = warm_up(job, tiny, tmp_path / "warm")
    assert stats["demonstrations"] == 16 and stats["successful"] == 8 and stats["steps"] == 80
    assert stats["final_loss"] < stats["first_loss"] / 3

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "warm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm", dtype=torch.float32)
    task = load_tasks("swe-toy", split="test", count=64)[0]
    messages = [{"role": "system", "content": SWE_SYSTEM_PROMPT}, {"role": "user", "content": task.prompt}]
    prompt = torch.tensor([ChatFormat(tokenizer).prompt_ids(messages)])
    ids = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
    out = model.generate(prompt, max_new_tokens=40, do_sample=False, **ids)
    text = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    assert isinstance(parse_tool_call(text), ToolCall), text


def landing_job(path: str, minimum: float, maximum: float = 1.0, max_rounds: int = 2) -> RLJob:
    landing = {"min": minimum, "max": maximum, "probeDemonstrations": 4, "extraSteps": 40, "learningRate": 5e-3}
    return warmup_job(path, landing={**landing, "maxRounds": max_rounds})


@pytest.mark.slow
def test_a_warm_up_below_its_landing_floor_trains_on_and_the_demonstrations_grow_likelier(tiny, tmp_path):
    # a floor no 90-step model reaches: every further round runs, each check is reported
    stats = warm_up(landing_job(write_dataset(tmp_path / "d.jsonl"), 0.99), tiny, tmp_path / "warm")
    checks = stats["landing"]
    assert stats["extra_rounds"] == 2 and len(checks) == 3 and not stats["landed"]
    assert stats["steps"] == 10 + 2 * 40
    assert checks[-1] > 10 * checks[0], checks  # the further steps are what lifts the successful calls


def write_short_dataset(path, count: int = 8) -> str:
    """Successful demonstrations of one short call each: their probability stays far above float underflow
    even for an untrained model (a whole episode's product of token probabilities can round to 0.0)."""
    tasks = load_tasks("swe-toy", split="train", count=count)
    lines = [
        json.dumps(
            {
                "taskId": task.task_id,
                "messages": [
                    {"role": "user", "content": task.prompt},
                    {"role": "assistant", "content": call("submit")},
                ],
                "reward": 1.0,
            }
        )
        for task in tasks
    ]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_a_warm_up_that_landed_stops_at_its_first_check(tiny, tmp_path):
    stats = warm_up(landing_job(write_short_dataset(tmp_path / "d.jsonl"), 1e-200), tiny, tmp_path / "warm")
    assert stats["extra_rounds"] == 0 and len(stats["landing"]) == 1 and stats["steps"] == 10 and stats["landed"]


def test_a_warm_up_above_its_landing_ceiling_says_so_and_does_not_train_more(tiny, tmp_path, capsys):
    job = landing_job(write_short_dataset(tmp_path / "d.jsonl"), 0.0, maximum=1e-200)
    stats = warm_up(job, tiny, tmp_path / "warm")
    assert stats["landing"][0] > 1e-200, stats  # a probability above the ceiling, not an underflow
    assert stats["extra_rounds"] == 0 and not stats["landed"]
    assert "above landing.max" in capsys.readouterr().out


def test_a_warm_up_without_a_landing_range_scores_nothing(tiny, tmp_path):
    stats = warm_up(warmup_job(write_dataset(tmp_path / "d.jsonl", count=4), steps=2), tiny, tmp_path / "warm")
    assert stats["landing"] == [] and stats["extra_rounds"] == 0


def test_a_landing_check_without_successful_demonstrations_is_refused(tiny, tmp_path):
    path = write_dataset(tmp_path / "d.jsonl", count=3, solved_every=1000)  # only line 0 solved
    lines = (tmp_path / "d.jsonl").read_text().splitlines()[1:]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match="no demonstration with a reward above 0"):
        warm_up(landing_job(path, 0.5), tiny, tmp_path / "warm")


def test_the_landing_metric_is_the_probability_of_every_trained_call(tiny, tmp_path):
    chat = ChatFormat(AutoTokenizer.from_pretrained(tiny))
    demo = demonstration_tokens(read_demonstrations(write_dataset(tmp_path / "d.jsonl", count=1))[0], chat)
    model = AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([demo.token_ids])).logits[0]
    logprob = sum(
        torch.log_softmax(logits[i - 1], -1)[demo.token_ids[i]].item()
        for i in range(1, len(demo.token_ids))
        if demo.loss_mask[i]
    )
    assert demonstration_probability(tiny, [demo]) == pytest.approx(torch.tensor(logprob).exp().item(), rel=1e-4)
