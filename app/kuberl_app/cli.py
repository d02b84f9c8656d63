"""The `kuberl` command line: one front door for every tier."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

import click

from kuberl import __version__
from kuberl.crd import rljob_crd_yaml
from kuberl.planning import fit_warnings
from kuberl.reference import reference_markdown
from kuberl.validation import validate_files
from kuberl_app.tasks_command import tasks as tasks_group

if TYPE_CHECKING:
    from kuberl.api.rljob import RLJob

EXIT_INVALID = 2
# one meaning for each option wherever it appears
MODEL_HELP = "Local model folder to use instead of spec.model.uri."
RUN_DIR_HELP = "The run's folder: metrics, checkpoints, the exported policy [runs/<job>]."
TASKS_HELP = "Another task file (JSONL: local path, file:// or s3://) instead of the job's tasks."


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="kuberl", message="%(prog)s %(version)s")
def main() -> None:
    """KubeRL: agentic reinforcement learning of LLMs on Kubernetes."""


@main.command()
@click.argument("files", nargs=-1, required=True, metavar="FILE...")
@click.option("-q", "--quiet", is_flag=True, help="Print problems only, nothing for valid documents.")
def validate(files: tuple[str, ...], quiet: bool) -> None:
    """Check RLJob manifests (YAML, one or many documents per file; '-' reads stdin).

    Exits 0 when every document is valid, 2 with one line per problem otherwise.
    """
    results = validate_files(files, runs_here=True)
    for result in results:
        if result.ok and not quiet:
            assert result.job is not None
            click.echo(f"{result.source}: RLJob {result.job.name!r} is valid")
        for problem in result.problems:
            click.echo(str(problem), err=True)
        if result.ok:
            assert result.job is not None
            for line in fit_warnings(result.job.spec):
                click.echo(f"{result.source}: warning: does not fit: {line} (kuberl plan for details)", err=True)
    if any(not r.ok for r in results):
        bad = sum(not r.ok for r in results)
        click.echo(f"{bad} of {len(results)} document(s) invalid", err=True)
        sys.exit(EXIT_INVALID)


@main.command("plan")
@click.argument("job_file", metavar="JOB.yaml")
@click.option("--model", "model_path", default=None, help=MODEL_HELP)
@click.option("--gpu-memory", default="80Gi", show_default=True, help="Memory of one GPU (a quantity).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--check", is_flag=True, help="Exit 1, saying what to change, when a tier does not fit.")
def plan_command(job_file: str, model_path: str | None, gpu_memory: str, as_json: bool, check: bool) -> None:
    """Estimate the learner's memory peak per device and the rollout tier's KV cache from the job and the
    model's config.json, and compare them with the resources the job requests (docs/operator.md). An s3://
    model is read with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (the job Secret's keys) and the job's
    spec.checkpoint.endpointUrl.

    Exits 2 with one line when the manifest or the model's config.json cannot be read; with --check, 1 when
    the job does not fit."""
    from kuberl.planning import PlanError, advice, plan_memory, quantity_bytes, read_model_shape
    from kuberl.validation import ManifestError, load_rljob

    try:
        job = load_rljob(job_file)
        shape = read_model_shape(model_path or job.spec.model.uri, endpoint_url=job.spec.checkpoint.endpoint_url)
        memory = int(quantity_bytes(gpu_memory))
        plan = plan_memory(job.spec, shape, memory)
    except (ManifestError, PlanError) as err:
        click.echo(str(err), err=True)
        sys.exit(EXIT_INVALID)
    if as_json:
        click.echo(json.dumps(plan.to_json(), indent=2))
    else:
        _print_plan(job.name, plan, shape)
    if check and plan.fits is False:
        for line in plan.problems():
            click.echo(f"{job_file}: does not fit: {line}", err=True)
        for line in advice(job.spec, shape, memory):
            click.echo(f"  to fit: {line}", err=True)
        sys.exit(1)


def _print_plan(name: str, plan, shape) -> None:
    """`kuberl plan`'s table."""
    from kuberl.planning import GIB, gib

    learner, rollout = plan.learner, plan.rollout
    verdict = {True: "fits", False: "DOES NOT FIT", None: "unknown (no memory request)"}

    def row(label: str, value: float | None) -> None:
        click.echo(f"  {label:<44} {gib(value):>14}")

    click.echo(f"{name}: {plan.parameters / 1e6:.1f}M parameters, {shape.layers} layers, vocab {shape.vocab_size}")
    budget = f"{learner.token_budget} ({'default' if learner.budget_is_default else 'spec.learner'})"
    click.echo(
        f"learner ({learner.device}, world size {learner.world_size}, mini-batch {learner.mini_batch_rows} rows of "
        f"up to {learner.longest_trajectory} tokens per rank, micro-batch budget {budget}: "
        f"{learner.micro_batch_tokens} tokens, log-probs in chunks of {learner.chunk_tokens})"
    )
    row("weights (float32, sharded)", learner.weights)
    row("gradients", learner.gradients)
    row("AdamW moments", learner.optimizer)
    if learner.gathered:
        row("FSDP gathered units", learner.gathered)
    if learner.reference:
        row("reference model", learner.reference)
    row("activations, no checkpointing", learner.activations_without_checkpointing)
    row("activations, with checkpointing", learner.activations_with_checkpointing)
    row("one chunk's logits and log-softmax", learner.logits)
    if learner.gradient_free_pass:
        row("gradient-free pass (old log-probs, reference)", learner.gradient_free_pass)
    if learner.host:
        row("offloaded to host", learner.host)
    checkpointing = "on" if learner.activation_checkpointing else "off"
    row(f"peak per device (checkpointing {checkpointing})", learner.peak)
    row("available", learner.budget)
    if learner.budget:
        click.echo(f"  {verdict[learner.fits]}, headroom {(learner.budget - learner.peak) / GIB:.2f} GiB")
    else:
        click.echo(f"  {verdict[learner.fits]}")
    click.echo(f"rollout ({rollout.device}, {rollout.sequences} sequences x {rollout.tokens_per_sequence} tokens)")
    row("weights", rollout.weights)
    row(f"KV cache ({rollout.kv_bytes_per_token} bytes per token)", rollout.kv_cache)
    row("needed per engine", rollout.need)
    row("available", rollout.budget)
    if rollout.budget:
        click.echo(f"  {verdict[rollout.fits]}, headroom {(rollout.budget - rollout.need) / GIB:.2f} GiB")
    else:
        click.echo(f"  {verdict[rollout.fits]}")


@main.command()
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, writable=True), help="Write to a file instead of stdout."
)
@click.option("--reference", is_flag=True, help="The Markdown field reference (docs/rljob.md) instead of the CRD.")
@click.option("--commands", is_flag=True, help="The Markdown command reference (docs/cli.md) instead of the CRD.")
def crds(output: str | None, reference: bool, commands: bool) -> None:
    """Print the RLJob CustomResourceDefinition generated from the API models."""
    from kuberl_app.cli_reference import cli_markdown

    text = cli_markdown(main) if commands else reference_markdown() if reference else rljob_crd_yaml()
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        click.echo(text, nl=False)


def _render_pool_images(job: RLJob, tasks_file: str) -> list[str]:
    """The environment images of the tasks in `tasks_file` for `kuberl render --tasks`; exits 2 with one line
    when the file cannot be read or spec.sandbox.imageTemplate names a field a task lacks."""
    from kuberl.suites import load_tasks
    from kuberl_operator.sandbox_pools import task_images

    if "://" not in tasks_file and not os.path.isfile(tasks_file):
        click.echo(f"{tasks_file}: file not found", err=True)
        sys.exit(EXIT_INVALID)
    try:
        return task_images(load_tasks(job.spec.environment.name, tasks_file), job.spec.sandbox)
    except (ValueError, OSError) as err:  # ImageTemplateError is a ValueError naming the field
        text = str(err)
        click.echo(text if text.startswith(tasks_file) else f"{tasks_file}: {text}", err=True)
    sys.exit(EXIT_INVALID)


@main.command()
@click.argument("job_file", metavar="JOB.yaml")
@click.option("-n", "--namespace", default=None, help="Namespace of the objects [the manifest's, else default].")
@click.option(
    "--uid",
    default=None,
    help="The RLJob's metadata.uid, for owner references (kubectl get rljob NAME -o "
    "jsonpath='{.metadata.uid}') [the manifest's; without one, no owner references].",
)
@click.option(
    "--tasks",
    "tasks_file",
    default=None,
    help=TASKS_HELP + " With it, the sandbox pool of each environment image its tasks name is printed too, at "
    "zero pods (the operator warms them at run time).",
)
def render(job_file: str, namespace: str | None, uid: str | None, tasks_file: str | None) -> None:
    """Print every object the operator creates for the RLJob in JOB.yaml as a YAML stream, like `helm template`.

    Exits 2 with one line per problem when the manifest is invalid, or with one line when the task file
    cannot be read or spec.sandbox.imageTemplate names a field its tasks lack; notes on the spec go to stderr."""
    from kuberl.validation import ManifestError, load_rljob
    from kuberl_operator.desired import desired_objects, render_warnings, render_yaml_stream, target_namespace
    from kuberl_operator.meta import owner_reference
    from kuberl_operator.pod import job_token_secret_name
    from kuberl_operator.secret import sandbox_token_secret_name

    try:
        job = load_rljob(job_file)
    except ManifestError as err:
        click.echo(str(err), err=True)
        sys.exit(EXIT_INVALID)
    images = _render_pool_images(job, tasks_file) if tasks_file else []
    uid = uid or (job.metadata.model_extra or {}).get("uid")
    owner = owner_reference(job, uid) if uid else None
    ns = target_namespace(job, namespace)
    click.echo(render_yaml_stream(desired_objects(job, ns, owner=owner, pool_images=images)), nl=False)
    if tasks_file:
        click.echo(f"note: {len(images)} sandbox pool(s) for the environment images of {tasks_file}", err=True)
    for line in render_warnings(job):
        click.echo(f"warning: {line}", err=True)
    if owner is None:
        click.echo("note: no --uid, so no ownerReferences: these objects outlive the RLJob", err=True)
    click.echo(
        f"note: sandbox and rollout pods read the sandbox token from Secret {sandbox_token_secret_name(job)!r}, "
        f"learner and rollout pods the job token from Secret {job_token_secret_name(job)!r} (key 'token' of "
        f"each) in namespace {ns!r}; the operator creates both",
        err=True,
    )


@main.command("operator")
@click.option(
    "-n", "--namespace", "namespaces", multiple=True, help="Watch RLJobs in this namespace (repeat) [all namespaces]."
)
@click.option("--liveness", default=None, help="Serve a liveness probe, e.g. http://0.0.0.0:8080/healthz.")
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve Prometheus metrics (the operator's and every job's) on this port [none].",
)
@click.option("-v", "--verbose", is_flag=True, help="Log every handler run.")
def operator_command(
    namespaces: tuple[str, ...], liveness: str | None, metrics_port: int | None, verbose: bool
) -> None:
    """Run the RLJob operator (kopf, one replica: no peering): applies each job's children, drives its
    state machine and enforces its circuit breakers. Credentials: in-cluster, else the kubeconfig.
    Configuration: the KUBERL_OPERATOR_* variables the chart sets, then these flags."""
    import dataclasses
    import os
    import socket

    import kopf

    from kuberl_operator.config import OperatorConfig
    from kuberl_operator.handlers import register

    config = OperatorConfig.from_env(os.environ)
    if metrics_port:
        config = dataclasses.replace(config, metrics_port=metrics_port)
    # as `kopf run` logs: a job's lines start with [namespace/name] (operators and benchmarks read them)
    kopf.configure(verbose=verbose, log_prefix=True)
    # kopf names itself after the login user unless told otherwise, and the images' user (65532) has no
    # passwd entry: getpass would fail the operator pod at start
    identity = os.environ.get("POD_ID") or f"kuberl-operator@{socket.gethostname()}"
    kopf.run(
        registry=register(config),
        identity=identity,  # type: ignore[arg-type]  # kopf's Identity is a NewType of str
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=liveness,
    )


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8700, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--root", default=None, help="Folder for session workspaces [env KUBERL_SANDBOX_ROOT; /tmp/kuberl-sandbox]."
)
@click.option("--max-sessions", default=2048, show_default=True, type=int, help="Sessions this process holds.")
@click.option("--session-timeout", default="30m", show_default=True, help="Close sessions idle this long (a duration).")
def sandbox(host: str, port: int, root: str | None, max_sessions: int, session_timeout: str) -> None:
    """Serve isolated code-execution sessions over HTTP (token from KUBERL_SANDBOX_TOKEN)."""
    import dataclasses

    import uvicorn

    from kuberl.api.types import parse_duration
    from kuberl_sandbox.api import create_app
    from kuberl_sandbox.execution import namespaces_available
    from kuberl_sandbox.session_manager import isolation_problem, report_start_failure
    from kuberl_sandbox.settings import SandboxSettings
    from kuberl_sandbox.uids import mapped_blocks

    try:
        settings = dataclasses.replace(
            SandboxSettings.from_env(root=root),
            max_sessions=max_sessions,
            session_idle_s=parse_duration(session_timeout),
        )
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    first_uid, _, _ = mapped_blocks(settings.uid_base, settings.uid_block_size, settings.uid_blocks)
    if problem := isolation_problem(settings, namespaces_available(first_uid)):
        report_start_failure(problem)  # one line, also where Kubernetes keeps a container's last words
        sys.exit(1)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning", access_log=False, loop="asyncio")


@main.command("run")
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--resume", is_flag=True, help="Continue a stopped run of this job from its newest checkpoint.")
@click.option("--run-dir", default=None, help=RUN_DIR_HELP)
@click.option("--model", "model_path", default=None, help=MODEL_HELP)
@click.option(
    "--evaluate/--no-evaluate",
    default=True,
    show_default=True,
    help="Measure the held-out solve rate (environment.tasks.evalSplit) before and after RL.",
)
@click.option(
    "--metrics-port",
    type=int,
    default=None,
    help="Serve the job-level metrics (phase, step, reward, restarts, ...) that the operator exports "
    "in a cluster on 127.0.0.1:PORT/metrics [none].",
)
@click.option(
    "--metrics-linger",
    default="0s",
    show_default=True,
    help="Serve the job metrics this long after the job ends (a scraper sees its final phase).",
)
@click.option(
    "--cpus",
    "pinning",
    multiple=True,
    metavar="TIER=CPUS",
    help="Keep a tier's processes on these cores, as pods on nodes of their own are (repeat per tier: "
    "--cpus rollout=0 --cpus sandbox=0 --cpus learner=1) [every tier on every core].",
)
def run_command(
    job_file: str,
    resume: bool,
    run_dir: str | None,
    model_path: str | None,
    evaluate: bool,
    metrics_port: int | None,
    metrics_linger: str,
    pinning: tuple[str, ...],
) -> None:
    """Run the whole RLJob on this machine: sandbox servers, rollout servers (vLLM) and the learner as
    local processes, supervised like the operator would, with progress, breakers and a learning curve.
    RUN_DIR/prometheus_targets.json lists every /metrics endpoint (Prometheus file_sd format). The sandbox
    servers take their token from KUBERL_SANDBOX_TOKEN when it is set (else a new one per run); the rollout
    servers ask for the run's own job token, written to RUN_DIR/job-token."""
    from pathlib import Path

    from kuberl_app.one_machine.runner import RunError, run_job
    from kuberl_rollout.server import load_job_tasks, resolve_rewards

    linger_s, cores = _run_options(metrics_linger, pinning)
    job = _job_to_run(job_file, model_path)
    try:
        # what the rollout servers would refuse (an unknown reward, tasks it cannot score), refused now
        load_job_tasks(job, resolve_rewards(job).function)
        _refuse_unready_repositories(job.spec.environment)
        _refuse_missing_demonstrations(job.spec.training.warmup.demonstrations)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    model = _model_to_run(job, model_path)
    warm_up = _warm_up_process(job_file) if job.spec.training.warmup.demonstrations is not None else None
    held_out, solve_rate = _held_out_scorer(job) if evaluate else ([], None)
    folder = Path(run_dir or f"runs/{job.name}")
    try:
        record = run_job(
            job,
            Path(job_file),
            folder,
            model,
            resume,
            warm_up=warm_up,
            evaluate=solve_rate if held_out else None,
            metrics_port=metrics_port,
            metrics_linger_s=linger_s,
            pinning=cores,
        )
    except RunError as err:
        raise click.UsageError(str(err)) from None
    click.echo(
        f"\n{job.name}: {record.phase}"
        + (f" ({record.reason})" if record.reason else "")
        + f" at step {record.step}: {record.message}"
    )
    if record.phase == "Failed":
        raise SystemExit(1)


def _run_options(metrics_linger: str, pinning: tuple[str, ...]) -> tuple[float, dict[str, frozenset[int]]]:
    """`kuberl run`'s --metrics-linger in seconds and --cpus as tier -> cores, each refused with its name."""
    from kuberl.api.types import parse_duration
    from kuberl_app.one_machine.processes import parse_pinning

    try:
        linger_s = parse_duration(metrics_linger)
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--metrics-linger") from None
    try:
        return linger_s, parse_pinning(list(pinning), os.sched_getaffinity(0))
    except ValueError as err:
        raise click.BadParameter(str(err), param_hint="--cpus") from None


def _warm_up_process(job_file: str):
    """The warm-up stage of `kuberl run`: `kuberl warm-up` in a child process of its own, so the fine-tuning's
    peak memory (about 10 GB for a 135M model) goes back to the machine before the learner and the engines
    start."""
    import subprocess

    from kuberl.api.command_lines import cli
    from kuberl_app.one_machine.runner import RunError

    def warm_up(model_path: str, out: str) -> str:
        argv = [*cli(sys.executable), "warm-up", job_file, "--model", model_path, "--out", out]
        code = subprocess.run(argv, check=False).returncode
        if code != 0:
            raise RunError(f"the warm-up failed (exit {code}); its output is above")
        return out

    return warm_up


def _held_out_scorer(job):
    """(the job's held-out tasks, the scorer of `kuberl evaluate` on the job's own servers while no learner
    uses them)."""
    from kuberl.suites import environment_tasks
    from kuberl_app.one_machine.evaluate import summary_line
    from kuberl_trainer.evaluation import evaluate as evaluate_tasks
    from kuberl_trainer.rollout_client import RolloutClient

    held_out = environment_tasks(job.spec.environment, str(job.spec.environment.tasks.eval_split))

    def solve_rate(urls: list[str], job_token: str) -> float:
        result = evaluate_tasks(RolloutClient(urls, job_token), held_out, seed=job.spec.training.seed)
        click.echo(summary_line(result.summary()))
        return result.solve_rate

    return held_out, solve_rate


def _refuse_job_option(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """`--job` of the older `kuberl evaluate POLICY --job JOB.yaml`, answered with the grammar of every command."""
    if value is not None:
        raise click.UsageError("the job file is the first argument: kuberl evaluate JOB.yaml --model POLICY_DIR", ctx)


def _job_to_run(job_file: str, model_path: str | None):
    """The job in JOB.yaml checked for running here; what is wrong with spec.model.uri does not matter when a model is
    given on the command line (`--model` replaces it). A usage error naming the field or file otherwise."""
    from kuberl.validation import ManifestError, load_rljob

    try:
        return load_rljob(job_file, runs_here=True)
    except ManifestError as err:
        problems = [p for p in err.problems if not (model_path and p.path == "spec.model.uri")]
        if problems:
            raise click.UsageError(str(ManifestError(problems))) from None
        return load_rljob(job_file)


def _model_to_run(job, model_path: str | None) -> str:
    """The local model folder a job runs: `--model`, else a local copy of spec.model.uri."""
    from pathlib import Path

    from kuberl.modeling.lora import ADAPTER_CONFIG
    from kuberl.storage import LocalCopyError, check_model_folder, local_copy

    try:
        model = model_path or str(local_copy(job.spec.model.uri))
        if model_path is not None and (Path(model_path) / ADAPTER_CONFIG).is_file():
            model = _merged_adapter(model_path, _adapter_base(Path(model_path) / ADAPTER_CONFIG, job))
    except LocalCopyError as err:
        hint = "the demo's tiny model: `python -m recipes.swe_toy tiny-model PATH`; or give --model"
        raise click.UsageError(f"spec.model.uri: {err} ({hint})") from None
    try:
        check_model_folder(model)
    except ValueError as err:
        raise click.UsageError(str(err)) from None
    return model


def _adapter_base(adapter_config, job) -> str:
    """The model an adapter was trained on: the folder its adapter_config.json names when it is here (after a
    warm-up, the warmed-up model, not spec.model.uri), else a local copy of spec.model.uri."""
    from pathlib import Path

    from kuberl.storage import local_copy

    recorded = json.loads(adapter_config.read_text()).get("base_model_name_or_path") or ""
    if recorded and (Path(recorded) / "config.json").is_file():
        return recorded
    click.echo(f"{adapter_config}: its base model {recorded!r} is not here; merging into spec.model.uri")
    return str(local_copy(job.spec.model.uri))


def _merged_adapter(adapter_dir: str, base_dir: str) -> str:
    """A LoRA policy (a PEFT adapter folder, what a job with spec.model.lora exports) as a full model folder to
    serve: the base with the adapters merged in float32, written once beside them (ADAPTER_DIR/merged)."""
    from pathlib import Path

    from kuberl_trainer.export import MERGED_DIR, merge_adapter

    merged = Path(adapter_dir) / MERGED_DIR
    if not (merged / "config.json").is_file():
        click.echo(f"merging the adapters of {adapter_dir} into {base_dir} (float32): {merged}")
        merge_adapter(adapter_dir, base_dir, merged)
    return str(merged)


@main.command("evaluate")
@click.option("--job", hidden=True, is_eager=True, expose_value=False, callback=_refuse_job_option)
@click.argument("job_file", metavar="JOB.yaml", type=click.Path(exists=True, dir_okay=False))
@click.option("--model", "model_path", default=None, help=MODEL_HELP + " [RUN_DIR/policy: the run's export]")
@click.option("--run-dir", default=None, help=RUN_DIR_HELP)
@click.option("--tasks", "tasks_uri", default=None, help=TASKS_HELP)
@click.option(
    "--split", default=None, help="Split to score [the job's environment.tasks.evalSplit; with --tasks: all]."
)
@click.option("--episodes", default=1, show_default=True, type=click.IntRange(min=1), help="Episodes per task.")
@click.option(
    "--output",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the summary as JSON here [beside the model: MODEL/../evaluation.json].",
)
def evaluate_command(
    job_file: str,
    model_path: str | None,
    run_dir: str | None,
    tasks_uri: str | None,
    split: str | None,
    episodes: int,
    output: str | None,
) -> None:
    """The held-out solve rate of a policy: the export of a run (the default: RUN_DIR/policy) or any Hugging Face
    folder given with --model, served by the job's own rollout server and sandbox (`kuberl run` measures its
    before and after numbers with the same scorer)."""
    from pathlib import Path

    from kuberl.rewards import check_tasks, resolve_reward
    from kuberl.suites import environment_tasks, load_tasks
    from kuberl.validation import ManifestError, load_rljob
    from kuberl_app.one_machine.evaluate import evaluate_policy, summary_line, write_summary

    if model_path is None:
        try:
            name = load_rljob(job_file).name
        except ManifestError as err:
            raise click.UsageError(str(err)) from None
        model_path = str(Path(run_dir or f"runs/{name}") / "policy")
    job = _job_to_run(job_file, model_path)
    try:
        env = job.spec.environment
        if tasks_uri is None:
            tasks = environment_tasks(env, split or str(env.tasks.eval_split))
        else:
            tasks = load_tasks(env.name, tasks_uri, split)
        # before any server starts: a task the job's reward cannot score is a usage error
        check_tasks(resolve_reward(job.spec.reward.function), tasks, tasks_uri or env.tasks.uri or env.name)
        _refuse_unready_repositories(env)
    except (ManifestError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    policy = _model_to_run(job, model_path)
    if not tasks:
        raise click.UsageError(f"no tasks to evaluate in {tasks_uri or env.name} (split {split or 'all'})")
    out = Path(output) if output else Path(policy).resolve().parent / "evaluation.json"
    # the servers' logs stay beside the summary: a failed evaluation is explained there
    summary = evaluate_policy(
        job, Path(job_file), policy, tasks, episodes, out.parent / f"{out.stem}-logs", log=click.echo
    )
    summary["tasks_source"] = tasks_uri or f"{env.name}:{split or env.tasks.eval_split}"
    write_summary(summary, out)
    click.echo(summary_line(summary))
    click.echo(f"summary written to {out}")


@main.command("rollout-server")
@click.argument("job_file", metavar="JOB.yaml")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=8800, show_default=True, type=int, help="Port to listen on.")
@click.option(
    "--sandbox-url", "sandbox_urls", multiple=True, help="Sandbox server URL (repeat) [env KUBERL_SANDBOX_URLS]."
)
@click.option("--model", "model_path", default=None, help=MODEL_HELP)
def rollout_server(job_file: str, host: str, port: int, sandbox_urls: tuple[str, ...], model_path: str | None) -> None:
    """Serve one vLLM engine and the agent loop for the RLJob in JOB.yaml. Callers present the job token (the file
    KUBERL_JOB_TOKEN_FILE names, else KUBERL_JOB_TOKEN) but for /healthz, /readyz and /metrics; sandboxes are
    called with KUBERL_SANDBOX_TOKEN."""
    import uvicorn

    from kuberl.validation import ManifestError, load_rljob
    from kuberl_rollout.server import build_app, settings_from_env

    try:
        # external agents run in this process and reach its sessions over loopback
        settings = settings_from_env(load_rljob(job_file), list(sandbox_urls), model_path, f"http://127.0.0.1:{port}")
        app = build_app(settings)
    except (ManifestError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, loop="asyncio")


@main.command()
@click.argument("job_file", metavar="JOB.yaml")
@click.option("--rollout-url", "rollout_urls", multiple=True, required=True, help="Rollout server URL (repeat).")
@click.option("--model", "model_path", default=None, help=MODEL_HELP)
@click.option("--run-dir", default=None, help=RUN_DIR_HELP)
@click.option("--metrics-port", type=int, default=None, help="Serve Prometheus metrics on this port (rank 0).")
def learner(
    job_file: str, rollout_urls: tuple[str, ...], model_path: str | None, run_dir: str | None, metrics_port: int | None
) -> None:
    """Train the RLJob's policy from rollouts. Launch with torchrun for FSDP over several processes:

    torchrun --nproc_per_node N -m kuberl_app.cli learner JOB.yaml --rollout-url URL

    Stops at training.totalSteps or a limit of spec.limits, or on SIGTERM, with a final checkpoint; the
    reason is in RUN_DIR/status.json. KUBERL_JOB_STARTED_AT (Unix seconds) sets when the job's wall clock
    started (default: now). The rollout servers are called with the job token (the file KUBERL_JOB_TOKEN_FILE
    names, else KUBERL_JOB_TOKEN)."""
    import os
    import time
    from pathlib import Path

    from kuberl.storage import check_model_folder, local_copy
    from kuberl.suites import environment_tasks
    from kuberl.tokens import read_job_token
    from kuberl.validation import ManifestError, load_rljob
    from kuberl_trainer.learner_loop import job_clock_start, run_learner

    try:
        job = load_rljob(job_file)
        env = job.spec.environment
        task_ids = [t.task_id for t in environment_tasks(env, str(env.tasks.split))]
        model = model_path or str(local_copy(job.spec.model.uri))
        check_model_folder(model)
        started = job_clock_start(os.environ, time.time())
        token = read_job_token()
    except (ManifestError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    folder = Path(run_dir or f"runs/{job.name}")
    run_learner(
        job,
        list(rollout_urls),
        model,
        folder,
        task_ids,
        token,
        log=lambda line: click.echo(json.dumps(line)),
        metrics_port=metrics_port,
        job_started_at=started,
    )


@main.command("warm-up")
@click.argument("job_file", metavar="JOB.yaml")
@click.option("--model", "model_path", required=True, help=MODEL_HELP + " The warm-up fine-tunes it.")
@click.option("--out", required=True, help="Folder the warmed-up model is saved to (warmup.json beside it).")
def warm_up_command(job_file: str, model_path: str, out: str) -> None:
    """The supervised warm-up of spec.training.warmup: fine-tune the model on the demonstrations file, check
    where it landed, save it to OUT. `kuberl run` runs it before RL as a process of its own."""
    from pathlib import Path

    from kuberl.validation import ManifestError, load_rljob
    from kuberl_trainer.warmup import warm_up

    try:
        job = load_rljob(job_file)
        stats = warm_up(job, model_path, out)
    except (ManifestError, ValueError) as err:
        raise click.UsageError(str(err)) from None
    # beside the model: demonstrations, losses, the landing checks and their further rounds
    (Path(out).parent / "warmup.json").write_text(json.dumps(stats, indent=1) + "\n")


def _refuse_missing_demonstrations(uri: str | None) -> None:
    """A warm-up whose local demonstrations file is not there fails now, not after the run has started."""
    from pathlib import Path

    if uri is not None and not uri.startswith("s3://") and not Path(uri.removeprefix("file://")).is_file():
        raise ValueError(
            f"spec.training.warmup.demonstrations: {uri}: no such file; write the demonstrations there "
            f"(docs/warmup.md; for swe-toy: python -m recipes.swe_toy demonstrations JOB.yaml --out {uri})"
        )


def _refuse_unready_repositories(env) -> None:
    """Instances on repositories: a missing mirror, commit or environment is a usage error before anything starts."""
    from kuberl.swebench.readiness import readiness_problems

    if problems := readiness_problems(env):
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise ValueError("; ".join(problems[:3]) + more)


main.add_command(tasks_group)

if __name__ == "__main__":
    main()
