"""The command line of each tier's process, written once for the operator's pods and for `kuberl run`.

Pure functions from the job and the few values that differ by place (addresses, ports, folders, the model) to
argv lists. A pod runs `python -m kuberl_app.cli ...`, a local process the same module under the running
interpreter; torchrun and the image pools' bundled server put their own launcher in front of the same
arguments.
"""

from __future__ import annotations

from collections.abc import Sequence

from kuberl.api.rljob import RLJob

CLI_MODULE = "kuberl_app.cli"
"""The module behind the `kuberl` console script: every tier's process runs `python -m` it."""


def cli(python: str = "python") -> list[str]:
    """`python -m kuberl_app.cli` with the given interpreter (a pod's `python`, or sys.executable locally)."""
    return [python, "-m", CLI_MODULE]


def sandbox_max_sessions(job: RLJob) -> int:
    """Sessions one sandbox server accepts: twice the sandbox.sessionsPerPod the tier is sized for, because
    sessions reach a server at random (a Service, or the rollout servers' spread over local servers), not by
    load, so a server can be handed more than its share. A rollout server that finds every server full waits
    for a place."""
    return 2 * job.spec.sandbox.sessions_per_pod


def sandbox_server_args(host: str, port: int, root: str, session_timeout: str, max_sessions: int) -> list[str]:
    """`kuberl sandbox`'s options, for a server of a job (sandbox_args) or one started without a job."""
    return [
        "--host",
        host,
        "--port",
        str(port),
        "--root",
        root,
        "--session-timeout",
        session_timeout,
        "--max-sessions",
        str(max_sessions),
    ]


def sandbox_args(job: RLJob, host: str, port: int, root: str) -> list[str]:
    """`kuberl sandbox`'s options for a server of `job`: its session timeout and sandbox_max_sessions."""
    timeout = job.spec.sandbox.session.timeout
    return sandbox_server_args(host, port, root, timeout, sandbox_max_sessions(job))


def sandbox_command(job: RLJob, host: str, port: int, root: str, python: str = "python") -> list[str]:
    """The whole `kuberl sandbox` command of a server of `job`."""
    return [*cli(python), "sandbox", *sandbox_args(job, host, port, root)]


def rollout_server_command(
    job_file: str,
    host: str,
    port: int,
    sandbox_urls: Sequence[str],
    model: str | None = None,
    python: str = "python",
) -> list[str]:
    """`kuberl rollout-server JOB.yaml`: serving on host:port, opening sessions on `sandbox_urls`; `model`
    (a local folder) instead of the job's spec.model.uri."""
    return [
        *cli(python),
        "rollout-server",
        job_file,
        "--host",
        host,
        "--port",
        str(port),
        *(["--model", model] if model is not None else []),
        *(arg for url in sandbox_urls for arg in ("--sandbox-url", url)),
    ]


def learner_args(
    job_file: str, run_dir: str, metrics_port: int, rollout_urls: Sequence[str], model: str | None = None
) -> list[str]:
    """`learner JOB.yaml ...`, the arguments after the launcher (`python -m kuberl_app.cli`, or torchrun's
    `-m kuberl_app.cli`): its run folder, rank 0's metrics port, the rollout servers it drives; `model` (a
    local folder) instead of the job's spec.model.uri."""
    return [
        "learner",
        job_file,
        *(["--model", model] if model is not None else []),
        "--run-dir",
        run_dir,
        "--metrics-port",
        str(metrics_port),
        *(arg for url in rollout_urls for arg in ("--rollout-url", url)),
    ]
