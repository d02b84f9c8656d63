"""What `kuberl run` starts for a job: the same entrypoints as the operator's pods, as local processes.
Pure functions from the job to process specs (argv, env, readiness URL) and to their metrics endpoints."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kuberl.api import env_vars
from kuberl.api.command_lines import CLI_MODULE, cli, learner_args, rollout_server_command, sandbox_command
from kuberl.api.rljob import RLJob
from kuberl.api.spec import SWE_BENCH
from kuberl.swebench.readiness import sandbox_environment

JOB_TOKEN_FILE = "job-token"
"""The file of a run's folder holding its job token (mode 0600, new each run)."""


@dataclass(frozen=True)
class ProcessSpec:
    name: str  # sandbox-0, rollout-0, learner
    tier: str  # sandbox | rollout | learner (restarts count per tier)
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str | None = None  # polled until 200 before the next tier starts; None: no readiness
    log: Path = Path("/dev/null")
    live_url: str | None = None  # liveness: failing it LIVENESS_FAILURES times in a row restarts the process
    cpus: frozenset[int] | None = None  # the cores it (and every process it starts) may run on; None: any


@dataclass(frozen=True)
class Ports:
    sandboxes: list[int]
    rollouts: list[int]
    learner_metrics: int


def local_replicas(job: RLJob) -> tuple[int, int, int]:
    """(sandboxes, rollout servers, learner ranks) on this machine."""
    spec = job.spec
    return max(1, spec.sandbox.min_replicas), spec.rollout.replicas, spec.learner.replicas


MEMORY_SCRATCH = "/dev/shm"


def sandbox_scratch(job: RLJob) -> str:
    """Where `kuberl run` puts its sandbox roots. A job on real repositories unpacks a repository per episode: in
    memory (tmpfs) that takes a tenth of the time it takes on disk (bench_swe_tasks measures both). Either way the
    folder is a shared scratch one, and each session gets a private copy of it with the root bind-mounted inside."""
    if job.spec.environment.name == SWE_BENCH and os.path.isdir(MEMORY_SCRATCH):
        return MEMORY_SCRATCH
    return "/tmp"


def sandbox_isolation(job: RLJob, run_dir: Path) -> dict[str, str]:
    """The job's egress rule, and the folders sessions must not see beside the server's installation: the run's
    folder (its token, logs and checkpoints) and the one holding a local task file (hidden tests, gold patches)."""
    hidden = [run_dir.resolve()]
    uri = job.spec.environment.tasks.uri
    if uri is not None and "://" not in uri.removeprefix("file://"):
        hidden.append(Path(uri.removeprefix("file://")).resolve().parent)  # read from the current folder
    return {
        env_vars.SANDBOX_EGRESS: job.spec.sandbox.egress.value,
        env_vars.SANDBOX_HIDDEN: ":".join(str(folder) for folder in hidden),
    }


def plan(
    job: RLJob,
    job_file: Path,
    run_dir: Path,
    model_path: str,
    ports: Ports,
    sandbox_token: str,
    sandbox_root: Path,
    cpus: int,
    pinning: Mapping[str, frozenset[int]] | None = None,
) -> list[ProcessSpec]:
    """Sandbox servers, then rollout servers, then the learner (torchrun when it has several ranks).
    `sandbox_root` must be traversable by the sessions' own uids (e.g. a 0711 folder under /tmp). `pinning`
    (tier -> cores, `kuberl run --cpus`) keeps tiers on cores of their own, as pods on their own nodes are;
    a pinned tier's threads are its cores. The rollout servers and the learner read the job token from
    RUN_DIR/job-token (the caller writes it), as their pods read it from the job's Secret; the sandboxes never
    learn it."""
    pinning = pinning or {}
    token = {env_vars.SANDBOX_TOKEN: sandbox_token}
    return [
        *_sandbox_processes(job, run_dir, ports, token, sandbox_root, pinning.get("sandbox")),
        *_rollout_processes(job_file, run_dir, model_path, ports, token, cpus, pinning.get("rollout")),
        _learner_process(job, job_file, run_dir, model_path, ports, cpus, pinning.get("learner")),
    ]


def _local_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def _sandbox_processes(
    job: RLJob,
    run_dir: Path,
    ports: Ports,
    token: dict[str, str],
    sandbox_root: Path,
    pinned: frozenset[int] | None,
) -> list[ProcessSpec]:
    """One `kuberl sandbox` per port, each with a root of its own under `sandbox_root`."""
    env = token | sandbox_environment(job.spec.environment) | sandbox_isolation(job, run_dir)
    out = []
    for i, port in enumerate(ports.sandboxes):
        url = _local_url(port)
        argv = sandbox_command(job, "127.0.0.1", port, str(sandbox_root / str(i)), python=sys.executable)
        logs = run_dir / "logs" / f"sandbox-{i}.log"
        out.append(ProcessSpec(f"sandbox-{i}", "sandbox", argv, env, f"{url}/readyz", logs, f"{url}/healthz", pinned))
    return out


def _rollout_processes(
    job_file: Path,
    run_dir: Path,
    model_path: str,
    ports: Ports,
    token: dict[str, str],
    cpus: int,
    pinned: frozenset[int] | None,
) -> list[ProcessSpec]:
    """One `kuberl rollout-server` per port, each opening sessions on every sandbox server."""
    sandbox_urls = [_local_url(p) for p in ports.sandboxes]
    job_token = {env_vars.JOB_TOKEN_FILE: str(run_dir / JOB_TOKEN_FILE)}
    # the engines share the machine with the learner: each gets its share of the cores as threads
    share = len(pinned) // len(ports.rollouts) if pinned else cpus // (len(ports.rollouts) + 1)
    threads = env_vars.cpu_engine_threads(share)
    env = {**token, **job_token, **threads, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    out = []
    for i, port in enumerate(ports.rollouts):
        url = _local_url(port)
        argv = rollout_server_command(
            str(job_file), "127.0.0.1", port, sandbox_urls, model=model_path, python=sys.executable
        )
        logs = run_dir / "logs" / f"rollout-{i}.log"
        out.append(ProcessSpec(f"rollout-{i}", "rollout", argv, env, f"{url}/readyz", logs, f"{url}/healthz", pinned))
    return out


def _learner_process(
    job: RLJob,
    job_file: Path,
    run_dir: Path,
    model_path: str,
    ports: Ports,
    cpus: int,
    pinned: frozenset[int] | None,
) -> ProcessSpec:
    """`kuberl learner`, under torchrun --standalone when the job has several ranks."""
    ranks = job.spec.learner.replicas
    rollout_urls = [_local_url(p) for p in ports.rollouts]
    args = learner_args(str(job_file), str(run_dir), ports.learner_metrics, rollout_urls, model=model_path)
    if ranks > 1:
        torchrun = str(Path(sys.executable).parent / "torchrun")
        argv = [torchrun, "--standalone", "--nproc_per_node", str(ranks), "-m", CLI_MODULE, *args]
    else:
        argv = [*cli(sys.executable), *args]
    threads = str(max(1, len(pinned or range(cpus)) // ranks))
    env = {env_vars.JOB_TOKEN_FILE: str(run_dir / JOB_TOKEN_FILE), env_vars.OMP_NUM_THREADS: threads}
    env["HF_HUB_OFFLINE"] = "1"
    return ProcessSpec("learner", "learner", argv, env, None, run_dir / "logs" / "learner.log", cpus=pinned)


TIERS = ("sandbox", "rollout", "learner")


def parse_pinning(values: list[str], available: set[int]) -> dict[str, frozenset[int]]:
    """`TIER=CPUS` options (`rollout=0`, `learner=1,2-3`) as tier -> cores; raises ValueError naming the option
    and what to write when a tier or core is unknown."""
    pinning: dict[str, frozenset[int]] = {}
    for value in values:
        tier, _, cores = value.partition("=")
        if tier not in TIERS or not cores:
            raise ValueError(
                f"--cpus {value!r}: expected TIER=CPUS with TIER one of {', '.join(TIERS)}, e.g. learner=1"
            )
        chosen: set[int] = set()
        try:
            for part in cores.split(","):
                first, _, last = part.partition("-")
                chosen.update(range(int(first), int(last or first) + 1))
        except ValueError:
            raise ValueError(f"--cpus {value!r}: CPUS is a list of cores and ranges such as 0,2-3") from None
        if missing := sorted(chosen - available):
            raise ValueError(f"--cpus {value!r}: cores {missing} are not available here (have {sorted(available)})")
        pinning[tier] = frozenset(chosen)
    return pinning


def prometheus_targets(job: RLJob, ports: Ports, job_metrics_port: int | None = None) -> list[dict]:
    """Every /metrics endpoint of a local run in Prometheus' file_sd format, labelled as a PodMonitor labels
    a job's pods in a cluster: `namespace`, `rljob`, `tier`, and `pod` (the process name). The job-level
    metrics (`kuberl run --metrics-port`) carry `namespace` and `rljob` themselves, so that target has none."""
    ids = {"namespace": job.metadata.namespace or "default", "rljob": job.name}
    endpoints = [(f"sandbox-{i}", "sandbox", p) for i, p in enumerate(ports.sandboxes)]
    endpoints += [(f"rollout-{i}", "rollout", p) for i, p in enumerate(ports.rollouts)]
    endpoints.append(("learner", "learner", ports.learner_metrics))
    targets = [
        {"targets": [f"127.0.0.1:{port}"], "labels": {**ids, "tier": tier, "pod": name}}
        for name, tier, port in endpoints
    ]
    if job_metrics_port:
        targets.append({"targets": [f"127.0.0.1:{job_metrics_port}"], "labels": {"pod": "kuberl-run"}})
    return targets
