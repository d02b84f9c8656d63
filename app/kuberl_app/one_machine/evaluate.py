"""`kuberl evaluate`: the held-out solve rate of any policy folder, with the job's own sandbox and rollout server.

The policy is served exactly as in training (the job's rollout settings: temperature, turn and token
limits, tools), so the number is comparable with the before/after evaluations of `kuberl run`, which call
the same scorer (`kuberl_trainer.evaluation.evaluate`) on the servers of the running job.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from kuberl.api import env_vars
from kuberl.api.environment import Task
from kuberl.api.rljob import RLJob
from kuberl.api.trajectory import FinishReason
from kuberl.tokens import write_token_file
from kuberl_app.one_machine.processes import JOB_TOKEN_FILE, Ports, plan, sandbox_scratch
from kuberl_app.one_machine.supervisor import Supervisor
from kuberl_sandbox.local import free_port


def served_policy_urls(
    job: RLJob,
    job_file: Path,
    policy: str,
    work_dir: Path,
    log: Callable[[str], None],
) -> tuple[Supervisor, list[str], str, Path]:
    """Start one sandbox and one rollout server for `policy` (the learner is not started); returns the
    supervisor (stop it with `stop_all`), the rollout server's URLs, the job token they ask for (also in
    WORK_DIR/job-token) and the sandbox root to remove."""
    ports = Ports([free_port()], [free_port()], free_port())
    sandbox_root = Path(tempfile.mkdtemp(prefix=f"kuberl-eval-{job.name}-", dir=sandbox_scratch(job)))
    os.chmod(sandbox_root, 0o711)  # session users (their own uids) must reach their workspaces
    token = os.environ.get(env_vars.SANDBOX_TOKEN) or secrets.token_hex(16)
    job_token = write_token_file(work_dir / JOB_TOKEN_FILE)
    specs = plan(job, job_file, work_dir, policy, ports, token, sandbox_root, os.cpu_count() or 1)
    serving = [s for s in specs if s.tier != "learner"]
    supervisor = Supervisor(serving, retry_budget=0, log=log)
    try:
        for spec in serving:
            if spec.tier == "rollout":
                log(f"serving {policy} (vLLM; about 20 seconds on CPU)")
            supervisor.start(spec.name)
    except BaseException:
        supervisor.stop_all()
        shutil.rmtree(sandbox_root, ignore_errors=True)
        raise
    return supervisor, [f"http://127.0.0.1:{p}" for p in ports.rollouts], job_token, sandbox_root


def evaluate_policy(
    job: RLJob,
    job_file: Path,
    policy: str,
    tasks: Sequence[Task],
    episodes: int,
    work_dir: Path,
    log: Callable[[str], None] = print,
) -> dict:
    """Score `episodes` episodes per task of `policy`; returns the evaluation's summary (a JSON object)."""
    from kuberl_trainer.evaluation import evaluate
    from kuberl_trainer.rollout_client import RolloutClient

    started = time.monotonic()
    supervisor, urls, job_token, sandbox_root = served_policy_urls(job, job_file, policy, work_dir, log)
    try:
        log(f"evaluating {len(tasks)} tasks x {episodes} episode(s) ...")
        result = evaluate(RolloutClient(urls, job_token), tasks, episodes, seed=job.spec.training.seed)
    finally:
        supervisor.stop_all()
        shutil.rmtree(sandbox_root, ignore_errors=True)
    return {"policy": str(policy), "job": job.name, **result.summary(), "wall_s": round(time.monotonic() - started, 1)}


def summary_line(summary: dict) -> str:
    """One line a person reads: the solve rate first."""
    return (
        f"held-out solve rate {summary['solve_rate']:.2f} ({summary['solved']}/{summary['episodes']} episodes "
        f"of {summary['tasks']} tasks), reward {summary['reward_mean']:.3f}, submitted {summary['submitted']}, "
        f"failed {summary['failed']}, {summary['seconds']:.0f}s"
        + _unsubmitted(summary.get("finish_reasons", {}))
        + "".join(f"\n  {count} failed: {reason}" for reason, count in summary.get("errors", {}).items())
    )


def _unsubmitted(finish_reasons: dict[str, int]) -> str:
    """How the episodes that did not submit ended, other than by an error (the failed line says those)."""
    rest = {
        reason: n for reason, n in finish_reasons.items() if reason not in (FinishReason.SUBMITTED, FinishReason.ERROR)
    }
    return f" (not submitted: {', '.join(f'{n} {reason}' for reason, n in rest.items())})" if rest else ""


def write_summary(summary: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
