"""The command reference (docs/cli.md), generated from the command line itself so it cannot drift.

`kuberl crds --commands --output docs/cli.md` writes it (`make crds` does); tests/cli/test_cli_reference.py keeps
the file current and every option documented."""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import click

HEADER = """# `kuberl` command reference

Generated from the command line by `make crds`; do not edit. Commands that take a job take its file
(`JOB.yaml`) as their first argument; `--model` (a local model folder used instead of `spec.model.uri`),
`--run-dir` (the run's folder, `runs/<job>` unless given) and `--tasks` (a task file used instead of the
job's) mean the same wherever they appear. `kuberl COMMAND --help` prints the same text.
"""


def commands(group: click.Group, prefix: str) -> Iterator[tuple[str, click.Command, click.Context]]:
    """Every command under `group` with its full name and a context to render it, in the order `--help` lists."""
    parent = click.Context(group, info_name=prefix)
    for name in group.list_commands(parent):
        command = group.get_command(parent, name)
        if command is None or command.hidden:
            continue
        ctx = click.Context(command, info_name=name, parent=parent)
        yield f"{prefix} {name}", command, ctx
        if isinstance(command, click.Group):
            yield from commands(command, f"{prefix} {name}")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def command_section(full_name: str, command: click.Command, ctx: click.Context) -> str:
    """One command: its usage line, its help and a table of its options."""
    usage = " ".join(command.collect_usage_pieces(ctx))
    lines = [f"## `{full_name}`", "", "```", f"{full_name} {usage}".rstrip(), "```", ""]
    if command.help:
        lines += [inspect.cleandoc(command.help), ""]
    rows = [
        record
        for param in command.get_params(ctx)
        if isinstance(param, click.Option)
        and "--help" not in param.opts
        and (record := param.get_help_record(ctx)) is not None
    ]
    if rows:
        lines += ["| Option | Description |", "|---|---|"]
        lines += [f"| `{_cell(names)}` | {_cell(help_text)} |" for names, help_text in rows]
        lines.append("")
    return "\n".join(lines)


def cli_markdown(group: click.Group, name: str = "kuberl") -> str:
    """The whole reference: a header, then one section per command."""
    sections = [command_section(full, command, ctx) for full, command, ctx in commands(group, name)]
    return HEADER + "\n" + "\n".join(sections)


def undocumented_options(group: click.Group, name: str = "kuberl") -> list[str]:
    """`command --option` for every visible option without help text."""
    return [
        f"{full} {param.opts[0]}"
        for full, command, ctx in commands(group, name)
        for param in command.get_params(ctx)
        if isinstance(param, click.Option) and not param.hidden and not param.help
    ]
