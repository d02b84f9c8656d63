"""`python -m recipes.swe_toy`: the swe-toy recipe's commands, the inputs of the demo's RLJob (its tiny model and
its demonstrations file) and the credit-assignment report on what a run left behind."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import click

from kuberl.api.environment import Environments
from recipes.swe_toy.scripted_episodes import WrongEdit

CREDIT_PROBE_TASKS = 30


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The swe-toy recipe: a tiny model, scripted demonstrations for the warm-up, and the credit report."""


@main.command("tiny-model")
@click.argument("path")
@click.option("--hidden-size", default=128, show_default=True, type=int, help="Width of the model's hidden layers.")
@click.option("--layers", default=4, show_default=True, type=int, help="Number of decoder layers.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the initial weights and pretraining.")
@click.option(
    "--copy-pretraining/--no-copy-pretraining",
    default=True,
    show_default=True,
    help="Pretrain the model to copy from its context (about 3 minutes on 2 CPU cores); "
    "without it the model is random and cannot learn an agent's tool calls.",
)
def tiny_model(path: str, hidden_size: int, layers: int, seed: int, copy_pretraining: bool) -> None:
    """Write a tiny Llama and its tokenizer (trained offline on swe-toy) to PATH."""
    from recipes.swe_toy.tiny_model import build_tiny_model

    folder = build_tiny_model(path, hidden_size=hidden_size, layers=layers, heads=max(1, hidden_size // 32), seed=seed)
    click.echo(f"wrote {folder}")
    if copy_pretraining:
        _pretrain_copying(folder, seed)


def _pretrain_copying(folder: Path, seed: int) -> None:
    from recipes.swe_toy.copy_pretraining import DEFAULT_CURRICULUM, CopyPretrainingFailed, pretrain_copying

    def progress(stage: int, step: int, loss: float, accuracy: float) -> None:
        current = DEFAULT_CURRICULUM[stage]
        if step % 100 == 0 or step == current.steps:
            words = f"{current.vocabulary} tokens" if current.vocabulary else "the whole vocabulary"
            click.echo(
                f"copy pretraining: stage {stage + 1}/{len(DEFAULT_CURRICULUM)}, step {step}/"
                f"{current.steps}, loss {loss:.3f}, copy accuracy {accuracy:.2f} ({words})"
            )

    try:
        accuracies = pretrain_copying(folder, seed=seed, on_progress=progress)
    except CopyPretrainingFailed as err:
        raise click.ClickException(str(err)) from None
    click.echo(f"copy pretraining: done, copy accuracy per stage {', '.join(f'{a:.2f}' for a in accuracies)}")


def _load_job(job_file: str):
    from kuberl.validation import ManifestError, load_rljob

    try:
        return load_rljob(job_file)
    except ManifestError as err:
        raise click.ClickException(str(err)) from None


@main.command("demonstrations")
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="The JSONL file to write.")
@click.option("--count", default=1200, show_default=True, type=click.IntRange(min=1), help="Episodes to play.")
@click.option(
    "--expert-fraction",
    default=0.5,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="The share of episodes that make the correct edit, spread evenly.",
)
@click.option(
    "--wrong-edit",
    default=WrongEdit.UNCHANGED.value,
    show_default=True,
    type=click.Choice([w.value for w in WrongEdit]),
    help="What the other episodes write: the buggy text copied back, or one of the task's wrong candidates.",
)
@click.option(
    "--recovery-fraction",
    default=0.3,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="The chance that an episode first slips on its edit (shown, not trained on) and recovers.",
)
@click.option("--seed", default=None, type=int, help="Seed of the plan  [the job's spec.training.seed].")
def demonstrations(
    job_file: str,
    out: str,
    count: int,
    expert_fraction: float,
    wrong_edit: str,
    recovery_fraction: float,
    seed: int | None,
) -> None:
    """Play scripted swe-toy episodes on the job's training tasks in a local sandbox and write them to OUT as a
    demonstrations file (spec.training.warmup.demonstrations), with the reward the job's reward function gave."""
    from kuberl.suites import environment_tasks
    from recipes.swe_toy.demonstrations import make_demonstrations, write_demonstrations

    job = _load_job(job_file)
    env = job.spec.environment
    tasks = environment_tasks(env, str(env.tasks.split))
    click.echo(
        f"demonstrations: playing {count} episodes on {len(tasks)} {env.tasks.split} tasks ({expert_fraction:.0%} "
        f"with the correct edit, the rest with the wrong edit '{wrong_edit}'; {recovery_fraction:.0%} recovering "
        "from a slipped edit)"
    )
    started = time.monotonic()
    with _job_environments(job) as environments:
        demos = asyncio.run(
            make_demonstrations(
                tasks,
                count,
                environments,
                seed=job.spec.training.seed if seed is None else seed,
                expert_fraction=expert_fraction,
                recovery_fraction=recovery_fraction,
                wrong_edit=WrongEdit(wrong_edit),
            )
        )
    path = write_demonstrations(demos, out)
    solved = sum(1 for d in demos if (d.reward or 0) > 0)
    slips = sum(1 for d in demos if any(not m.train for m in d.messages))
    click.echo(
        f"wrote {len(demos)} demonstrations to {path} in {time.monotonic() - started:.1f}s: {solved} solved their "
        f"task (reward above 0), {slips} recover from a slip"
    )


@contextmanager
def _job_environments(job) -> Iterator[Callable[[], Environments]]:
    """A local sandbox server while the block runs, and environments on it scored with the job's reward."""
    from kuberl.rewards import RewardFieldError, job_rewards
    from kuberl_rollout.sandbox_client import SandboxEnvironments
    from kuberl_sandbox.local import local_sandbox

    try:
        reward_fn, _ = job_rewards(job.spec.reward)
    except RewardFieldError as err:
        raise click.ClickException(str(err)) from None
    with local_sandbox() as sandbox:
        yield lambda: SandboxEnvironments(sandbox.url, sandbox.token, reward_fn)


@main.command("credit")
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False))
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
def credit(run_dir: str, job_file: str) -> None:
    """The credit-assignment report of a run: log P of the correct edit and of the first check on held-out
    swe-toy tasks, under the warmed-up model (RUN_DIR/warmup/model) and the trained policy (RUN_DIR/policy);
    written to RUN_DIR/credit.json."""
    from kuberl.modeling.tool_calls import SWE_SYSTEM_PROMPT
    from kuberl.suites import environment_tasks
    from recipes.swe_toy.action_probes import credit_report

    folder = Path(run_dir)
    before, after = folder / "warmup" / "model", folder / "policy"
    if missing := [str(p) for p in (before, after) if not (p / "config.json").exists()]:
        click.echo(f"credit assignment: no report, {' and '.join(missing)} not there (a run with a warm-up makes both)")
        return
    job = _load_job(job_file)
    env = job.spec.environment
    held_out = environment_tasks(env, str(env.tasks.eval_split))
    # only swe-toy-like tasks have a known correct edit
    tasks = [t for t in held_out if {"file", "buggy", "fix"} <= set(t.metadata)][:CREDIT_PROBE_TASKS]
    if not tasks:
        raise click.ClickException(f"no held-out task of {env.name} names its correct edit (metadata file, buggy, fix)")
    click.echo(f"credit assignment: log P of the correct edit and of the first check on {len(tasks)} held-out tasks")
    with _job_environments(job) as environments:
        report = credit_report(str(before), str(after), tasks, environments, SWE_SYSTEM_PROMPT)
    for action, numbers in report.items():
        click.echo(f"  {action:>16}: {numbers['before']:8.3f} -> {numbers['after']:8.3f} ({numbers['change']:+.3f})")
    (folder / "credit.json").write_text(json.dumps(report, indent=1) + "\n")
