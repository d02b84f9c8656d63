"""The swe-toy scripted workflow: the calls of one demonstrated episode (run the tests, replace the buggy text,
run the tests again, submit), with the correct edit or a wrong one. The recipe's demonstrations are episodes
played from it; the action probes play its prefix to score an action."""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import StrEnum

from kuberl.api.environment import Task, ToolCall
from kuberl.modeling.tool_calls import CLOSE, OPEN, format_tool_call


class WrongEdit(StrEnum):
    """What the demonstrations that do not fix the bug write in place of the buggy text."""

    UNCHANGED = "unchanged"
    """The buggy text itself, copied from the failing test's message: an edit that changes nothing, then
    submit. The same skill as the fix (copying an expression the test output quotes), aimed at the wrong one."""
    CANDIDATE = "candidate"
    """One of the task's plausible wrong fixes, which appears nowhere in the workspace: written from memory."""


@dataclass(frozen=True)
class Slip:
    """A failed attempt at a call, played like any call but kept out of the loss: the demonstration shows
    the error it gets and what comes next, so the model learns to recover, never to slip."""

    text: str


def wrong_edits(task: Task) -> list[str]:
    """The task's candidate replacements of its buggy text that are not the fix."""
    meta = task.metadata
    wrong = [c for c in meta.get("candidates", []) if c != meta.get("fix") and c != meta.get("buggy")]
    if not wrong or "file" not in meta or "buggy" not in meta:
        raise ValueError(f"task {task.task_id}: demonstrations need metadata file, buggy, fix and wrong candidates")
    return wrong


def scripted_calls(
    task: Task,
    rng: random.Random,
    expert: bool = False,
    recover: bool = False,
    wrong: WrongEdit = WrongEdit.CANDIDATE,
) -> list[ToolCall | Slip]:
    """One demonstration's calls: the swe-toy workflow with the fix (`expert`) or the wrong edit `wrong`
    (the buggy text unchanged, or a random wrong candidate); with `recover`, a failed attempt at the edit
    (a `Slip`) comes first."""
    meta = task.metadata
    if expert:
        new = meta["fix"]
    elif wrong == WrongEdit.UNCHANGED:
        wrong_edits(task)  # the same metadata check: a task without a known bug cannot be demonstrated
        new = meta["buggy"]
    else:
        new = rng.choice(wrong_edits(task))
    edit = ToolCall(name="replace", arguments={"path": meta["file"], "old": meta["buggy"], "new": new})
    # The failing assertion quotes both the expression the line has and the one it should use, so the edit
    # follows the test output directly. Reading the file first (as before) made every episode about 300
    # tokens longer, put the test output that far from the edit, and cost a turn.
    calls: list[ToolCall | Slip] = [
        ToolCall(name="run_tests", arguments={}),  # first, so the failure message is in context for the edit
        edit,
        ToolCall(name="run_tests", arguments={}),
        ToolCall(name="submit", arguments={}),
    ]
    if recover:
        calls.insert(1, slipped_edit(edit, meta["fix"], rng))
    return calls


def slipped_edit(edit: ToolCall, fix: str, rng: random.Random) -> Slip:
    """The two slips seen most when a warmed-up policy samples its edit at temperature 1: the call cut off
    before its closing tag (a parse error), or `old` set to the expression the test names, which is not in
    the file (the sandbox's error)."""
    if rng.random() < 0.5:
        text = format_tool_call(edit)
        return Slip(text[: rng.randrange(len(OPEN) + 1, len(text) - len(CLOSE))])
    return Slip(format_tool_call(ToolCall(name="replace", arguments={**edit.arguments, "old": fix})))
