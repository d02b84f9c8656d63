"""One grammar for the command line, and its reference (docs/cli.md) generated from it and kept current."""

from __future__ import annotations

from pathlib import Path

import click

from kuberl_app.cli import MODEL_HELP, RUN_DIR_HELP, TASKS_HELP, main
from kuberl_app.cli_reference import cli_markdown, commands, undocumented_options

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SHARED_MEANING = {"--model": MODEL_HELP, "--run-dir": RUN_DIR_HELP, "--tasks": TASKS_HELP}


def test_the_command_reference_is_current():
    assert REFERENCE.read_text() == cli_markdown(main), "docs/cli.md is stale: run `make crds`"


def test_every_option_has_help_text():
    assert undocumented_options(main) == []


def test_the_job_file_is_the_first_argument_of_every_command_that_takes_one():
    taking_a_job = []
    for name, command, _ in commands(main, "kuberl"):
        arguments = [p for p in command.params if isinstance(p, click.Argument)]
        if any(p.name == "job_file" for p in arguments):
            taking_a_job.append(name)
            assert arguments[0].name == "job_file", name
        assert not any("--job" in p.opts for p in command.params if not getattr(p, "hidden", False)), name
    assert {"kuberl run", "kuberl plan", "kuberl render", "kuberl evaluate", "kuberl learner"} <= set(taking_a_job)


def test_shared_options_mean_the_same_wherever_they_appear():
    seen = set()
    for name, command, _ in commands(main, "kuberl"):
        for param in command.params:
            for opt, meaning in SHARED_MEANING.items():
                if isinstance(param, click.Option) and opt in param.opts:
                    assert param.help is not None and param.help.startswith(meaning), f"{name} {opt}: {param.help}"
                    seen.add((name, opt))
    assert ("kuberl run", "--model") in seen and ("kuberl evaluate", "--model") in seen


def test_a_missing_help_text_is_found():
    @click.group()
    def group() -> None:
        """A group."""

    @group.command()
    @click.option("--quiet", is_flag=True)
    @click.option("--loud", is_flag=True, help="Shout.")
    def speak(quiet: bool, loud: bool) -> None:
        """Speak."""

    assert undocumented_options(group, "tool") == ["tool speak --quiet"]
