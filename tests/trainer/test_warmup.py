"""The supervised warm-up: scripted demonstrations teach the tool format with wrong edits only, never the
fix, so whatever the policy solves afterwards, RL taught it."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from conftest import with_spec
from transformers import AutoModelForCausalLM, AutoTokenizer

from kuberl.api.environment import ToolCall
from kuberl.api.rljob import RLJob
from kuberl.api.spec import WrongEdit
from kuberl.modeling.chat import ChatFormat
from kuberl.modeling.tiny import build_tiny_model
from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT, ParseError, format_tool_call, parse_tool_call
from kuberl.suites import load_tasks
from kuberl_rollout.sandbox_client import SandboxClient, SandboxEnvironments
from kuberl_trainer.demonstrations import Slip
from kuberl_trainer.scripted_episodes import scripted_calls
from kuberl_trainer.warmup import make_demonstrations, warm_up


def sandboxes(sandbox):
    """What the composition root hands the warm-up: environments on the test's sandbox server."""
    return lambda: SandboxEnvironments(sandbox.url, sandbox.token)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("warmup") / "model", hidden_size=64, layers=2, seed=3)


@pytest.fixture(scope="module")
def train_tasks():
    return load_tasks("swe-toy", split="train")


def masked_segments(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The runs of consecutive trainable tokens."""
    segments: list[list[int]] = []
    for i, (token, m) in enumerate(zip(ids, mask, strict=True)):
        if m:
            if i == 0 or not mask[i - 1]:
                segments.append([])
            segments[-1].append(token)
    return segments


async def first_observation(sandbox, task) -> str:
    client = SandboxClient(sandbox.url, sandbox.token)
    try:
        session = await client.create_session(task)
        await client.close(session["sessionId"])
        return session["observation"]
    finally:
        await client.aclose()


def test_the_script_edits_the_buggy_text_with_a_wrong_candidate_on_every_task():
    rng = random.Random(0)
    for task in load_tasks("swe-toy"):
        meta = task.metadata
        calls = scripted_calls(task, rng)
        assert [c.name for c in calls] == ["run_tests", "replace", "run_tests", "submit"]
        edit = calls[1].arguments
        assert (edit["path"], edit["old"]) == (meta["file"], meta["buggy"])
        assert edit["new"] in meta["candidates"] and edit["new"] != meta["fix"]
        assert meta["fix"] not in "".join(format_tool_call(c) for c in calls)


def test_the_script_draws_different_wrong_edits(train_tasks):
    task = next(t for t in train_tasks if len(t.metadata["candidates"]) >= 3)
    rng = random.Random(0)
    assert len({scripted_calls(task, rng)[1].arguments["new"] for _ in range(50)}) >= 2


def test_expert_demonstrations_make_the_fix_at_the_fraction_asked(sandbox, tiny, train_tasks):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = train_tasks[:5]
    demos = asyncio.run(
        make_demonstrations(tasks, 10, sandboxes(sandbox), ChatFormat(tokenizer), seed=1, expert_fraction=0.3)
    )
    fixes = 0
    for demo in demos:
        calls = [tokenizer.decode(s[:-1]) for s in masked_segments(demo.token_ids, demo.loss_mask)]
        edit = parse_tool_call(calls[1]).arguments
        task = next(t for t in tasks if t.metadata["file"] == edit["path"] and t.metadata["buggy"] == edit["old"])
        fixes += edit["new"] == task.metadata["fix"]
    assert fixes == 3  # round(10 * 0.3), spread over the plan
    with pytest.raises(ValueError, match="expertFraction"):
        asyncio.run(
            make_demonstrations(
                tasks,
                2,
                sandboxes(sandbox),
                ChatFormat(tokenizer),
                expert_fraction=2,
            )
        )


def test_demonstrations_never_train_on_the_fix_and_mask_exactly_the_calls(sandbox, tiny, train_tasks):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = train_tasks[:6]
    demos = asyncio.run(make_demonstrations(tasks, 6, sandboxes(sandbox), ChatFormat(tokenizer), seed=1))
    for demo in demos:
        assert demo.final_done and len(demo.loss_mask) == len(demo.token_ids)
        full = tokenizer.decode(demo.token_ids)
        edit = parse_tool_call(tokenizer.decode(masked_segments(demo.token_ids, demo.loss_mask)[1][:-1])).arguments
        task = next(t for t in tasks if t.metadata["file"] == edit["path"] and t.metadata["buggy"] == edit["old"])
        segments = masked_segments(demo.token_ids, demo.loss_mask)
        calls = [tokenizer.decode(s[:-1]) for s in segments]
        assert all(s[-1] == tokenizer.eos_token_id for s in segments)  # each call ends its turn
        assert [parse_tool_call(c).name for c in calls] == ["run_tests", "replace", "run_tests", "submit"]
        trained = "".join(calls)
        assert task.metadata["fix"] not in trained
        assert parse_tool_call(calls[1]).arguments["new"] != task.metadata["fix"]
        # the failing test names the fix: it is in the context, but only as an observation (not trained on)
        assert task.metadata["fix"] in full
        context = tokenizer.decode([t for t, m in zip(demo.token_ids, demo.loss_mask, strict=True) if not m])
        assert SWE_SYSTEM_PROMPT in context and '"name": "replace"' not in context


def test_a_recovering_script_slips_on_the_edit_then_makes_it(train_tasks):
    rng = random.Random(0)
    slips = []
    for task in train_tasks[:40]:
        calls = scripted_calls(task, rng, recover=True)
        assert isinstance(calls[1], Slip) and [c.name for c in calls[2:]] == ["replace", "run_tests", "submit"]
        slips.append(parse_tool_call(calls[1].text))
    cut = [s for s in slips if isinstance(s, ParseError)]
    assert cut and all("no tool call found" in s.message for s in cut)  # cut before its closing tag
    wrong_old = [s for s in slips if not isinstance(s, ParseError)]
    assert wrong_old and all(s.name == "replace" for s in wrong_old)


def test_a_slip_is_shown_with_its_error_and_never_trained_on(sandbox, tiny, train_tasks):
    """The slip and its error are context; the calls after it are the same workflow, trained as usual."""
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = train_tasks[:4]
    demos = asyncio.run(
        make_demonstrations(
            tasks, 12, sandboxes(sandbox), ChatFormat(tokenizer), seed=1, expert_fraction=1.0, recovery_fraction=1.0
        )
    )
    errors = {"no tool call found": 0, "old text not found": 0}
    for demo in demos:
        assert demo.final_done
        segments = masked_segments(demo.token_ids, demo.loss_mask)
        calls = [parse_tool_call(tokenizer.decode(s[:-1])) for s in segments]
        assert [c.name for c in calls] == ["run_tests", "replace", "run_tests", "submit"]
        context = tokenizer.decode([t for t, m in zip(demo.token_ids, demo.loss_mask, strict=True) if not m])
        assert "<|assistant|><tool_call>" in context  # the slip, untrained
        for error in errors:
            errors[error] += error in context
    assert all(errors.values()), errors  # both kinds of slip, each with the error the rollout tier would show
    with pytest.raises(ValueError, match="recoveryFraction"):
        asyncio.run(make_demonstrations(tasks, 2, sandboxes(sandbox), ChatFormat(tokenizer), recovery_fraction=-0.1))


@pytest.mark.slow
def test_a_short_warm_up_makes_a_tiny_model_call_tools(sandbox, tiny, tmp_path):
    job = RLJob.model_validate(
        with_spec(
            training={"seed": 2, "warmup": {"demonstrations": 8, "steps": 80, "learningRate": 5e-3, "batchSize": 4}},
        )
    )
    stats = warm_up(job, tiny, tmp_path / "warm", sandboxes(sandbox))
    assert stats["demonstrations"] == 8 and stats["steps"] == 80
    assert stats["final_loss"] < stats["first_loss"] / 3

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "warm")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "warm", dtype=torch.float32)
    held_out = load_tasks("swe-toy", split="test")[0]
    observation = asyncio.run(first_observation(sandbox, held_out))
    messages = [{"role": "system", "content": SWE_SYSTEM_PROMPT}, {"role": "user", "content": observation}]
    prompt = torch.tensor([ChatFormat(tokenizer).prompt_ids(messages)])
    out = model.generate(
        prompt,
        max_new_tokens=40,
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text = tokenizer.decode(out[0, prompt.shape[1] :], skip_special_tokens=True)
    assert isinstance(parse_tool_call(text), ToolCall), text


def landing_job(min_correct_edit: float, max_rounds: int = 2) -> RLJob:
    warmup = {"demonstrations": 8, "expertFraction": 1.0, "steps": 10, "learningRate": 5e-3, "batchSize": 4}
    landing = {"minCorrectEdit": min_correct_edit, "probeTasks": 4, "extraSteps": 40, "learningRate": 5e-3}
    return RLJob.model_validate(
        with_spec(training={"seed": 2, "warmup": {**warmup, "landing": {**landing, "maxRounds": max_rounds}}})
    )


@pytest.mark.slow
def test_a_warm_up_below_its_landing_floor_trains_on_and_the_correct_edit_grows_likelier(sandbox, tiny, tmp_path):
    # a floor no 90-step model reaches: every further round runs, each check is reported
    stats = warm_up(landing_job(0.99), tiny, tmp_path / "warm", sandboxes(sandbox))
    checks = stats["correct_edit"]
    assert stats["extra_rounds"] == 2 and len(checks) == 3
    assert stats["steps"] == 10 + 2 * 40
    assert checks[-1] > 10 * checks[0], checks  # the further steps are what lifts the edit


def test_a_warm_up_that_landed_stops_at_its_first_check(sandbox, tiny, tmp_path):
    stats = warm_up(landing_job(1e-200), tiny, tmp_path / "warm", sandboxes(sandbox))
    assert stats["extra_rounds"] == 0 and len(stats["correct_edit"]) == 1 and stats["steps"] == 10


def test_a_warm_up_without_a_landing_floor_probes_nothing(sandbox, tiny, tmp_path):
    job = RLJob.model_validate(
        with_spec(training={"seed": 2, "warmup": {"demonstrations": 4, "steps": 2, "batchSize": 2}})
    )
    stats = warm_up(job, tiny, tmp_path / "warm", sandboxes(sandbox))
    assert stats["correct_edit"] == [] and stats["extra_rounds"] == 0


def test_an_unchanged_wrong_edit_copies_the_buggy_text_back(train_tasks):
    """`wrongEdit: unchanged`: the edit quotes the buggy text as both old and new (the tests still fail, and
    submitting scores 0); the fix never appears in a trained call."""
    rng = random.Random(0)
    for task in train_tasks[:40]:
        meta = task.metadata
        calls = scripted_calls(task, rng, wrong=WrongEdit.UNCHANGED)
        assert [c.name for c in calls] == ["run_tests", "replace", "run_tests", "submit"]
        assert calls[1].arguments == {"path": meta["file"], "old": meta["buggy"], "new": meta["buggy"]}
        assert meta["fix"] not in "".join(format_tool_call(c) for c in calls)
        assert scripted_calls(task, rng, expert=True, wrong=WrongEdit.UNCHANGED)[1].arguments["new"] == meta["fix"]


def test_an_unchanged_edit_is_accepted_by_the_sandbox(sandbox, tiny, train_tasks):
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = train_tasks[:3]
    demos = asyncio.run(
        make_demonstrations(tasks, 3, sandboxes(sandbox), ChatFormat(tokenizer), seed=1, wrong_edit=WrongEdit.UNCHANGED)
    )
    for demo in demos:
        assert demo.final_done
        context = tokenizer.decode([t for t, m in zip(demo.token_ids, demo.loss_mask, strict=True) if not m])
        assert "Replaced 1 occurrence(s)" in context  # the edit's own observation: accepted, not refused
