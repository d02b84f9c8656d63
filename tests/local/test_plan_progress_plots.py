"""The pure parts of `kuberl run`: the process plan, the progress line and the learning-curve plot."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import with_spec

from kuberl.api.rljob import RLJob
from kuberl_app.one_machine.plots import plot_learning_curve
from kuberl_app.one_machine.processes import Ports, ProcessSpec, parse_pinning, plan
from kuberl_app.one_machine.progress import ProgressPrinter, duration, progress_line
from kuberl_app.one_machine.supervisor import Supervisor


def processes(**sections):
    job = RLJob.from_manifest(with_spec(**sections))
    return plan(
        job,
        Path("job.yaml"),
        Path("runs/j"),
        "/models/m",
        Ports([8701, 8702], [8801, 8802], 9400),
        "tok",
        Path("/tmp/sbx"),
        cpus=2,
    )


def test_the_plan_starts_the_tiers_in_order_with_the_same_entrypoints_as_the_pods():
    specs = processes(sandbox={"minReplicas": 2}, rollout={"replicas": 2})
    assert [s.name for s in specs] == ["sandbox-0", "sandbox-1", "rollout-0", "rollout-1", "learner"]
    rollout = specs[2].argv
    assert rollout[rollout.index("--port") + 1] == "8801" and rollout[rollout.index("--model") + 1] == "/models/m"
    assert [rollout[i + 1] for i, a in enumerate(rollout) if a == "--sandbox-url"] == [
        "http://127.0.0.1:8701",
        "http://127.0.0.1:8702",
    ]
    learner = specs[-1].argv
    assert [learner[i + 1] for i, a in enumerate(learner) if a == "--rollout-url"] == [
        "http://127.0.0.1:8801",
        "http://127.0.0.1:8802",
    ]
    assert specs[0].env["KUBERL_SANDBOX_TOKEN"] == "tok" == specs[2].env["KUBERL_SANDBOX_TOKEN"]
    assert "KUBERL_SANDBOX_TOKEN" not in specs[-1].env  # the learner never talks to sandboxes
    # the rollout servers and the learner read the run's job token from its file; the sandboxes never see it
    assert specs[2].env["KUBERL_JOB_TOKEN_FILE"] == "runs/j/job-token" == specs[-1].env["KUBERL_JOB_TOKEN_FILE"]
    assert all(not name.startswith("KUBERL_JOB_TOKEN") for s in specs[:2] for name in s.env)
    assert specs[2].ready_url == "http://127.0.0.1:8801/readyz" and specs[2].live_url.endswith("/healthz")


def test_sandboxes_get_the_jobs_egress_and_keep_the_run_and_its_task_file_out_of_sight(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    specs = processes(sandbox={"egress": "allow"}, environment={"tasks": {"uri": "data/tasks.jsonl"}})
    sandbox = specs[0].env
    assert sandbox["KUBERL_SANDBOX_EGRESS"] == "allow"
    assert sandbox["KUBERL_SANDBOX_HIDDEN"].split(":") == [str(tmp_path / "runs/j"), str(tmp_path / "data")]
    assert processes()[0].env["KUBERL_SANDBOX_EGRESS"] == "deny"


def test_several_learner_ranks_run_under_torchrun_and_share_the_cores():
    learner = processes(learner={"replicas": 2})[-1]
    assert learner.argv[0].endswith("torchrun") and learner.argv[learner.argv.index("--nproc_per_node") + 1] == "2"
    assert learner.env["OMP_NUM_THREADS"] == "1"
    assert processes()[-1].argv[1:3] == ["-m", "kuberl_app.cli"]  # one rank: plain python


def test_each_vllm_engine_gets_its_share_of_the_cores_as_unpinned_threads():
    # vLLM's own default binds a thread per visible core; on 2 shared cores the second one spin-waits
    engines = [s for s in processes() if s.tier == "rollout"]
    assert [(s.env["OMP_NUM_THREADS"], s.env["VLLM_CPU_OMP_THREADS_BIND"]) for s in engines] == [("1", "nobind")] * 2
    job = RLJob.from_manifest(with_spec())
    wide = plan(job, Path("j.yaml"), Path("r"), "/m", Ports([1], [2], 3), "t", Path("/tmp/s"), cpus=16)
    assert [s.env.get("OMP_NUM_THREADS") for s in wide] == [None, "8", "16"]


def test_pinned_tiers_keep_their_cores_and_take_them_as_threads():
    job = RLJob.from_manifest(with_spec())
    pinning = parse_pinning(["rollout=0", "sandbox=0", "learner=1-3"], set(range(4)))
    specs = plan(job, Path("j.yaml"), Path("r"), "/m", Ports([1], [2], 3), "t", Path("/tmp/s"), 4, pinning)
    assert [(s.tier, s.cpus) for s in specs] == [
        ("sandbox", frozenset({0})),
        ("rollout", frozenset({0})),
        ("learner", frozenset({1, 2, 3})),
    ]
    assert [s.env.get("OMP_NUM_THREADS") for s in specs] == [None, "1", "3"]
    assert all(s.cpus is None for s in plan(job, Path("j"), Path("r"), "/m", Ports([1], [2], 3), "t", Path("/s"), 4))


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("gpu=0", "TIER one of sandbox, rollout, learner"),
        ("learner", "TIER one of sandbox, rollout, learner"),
        ("learner=a", "a list of cores and ranges such as 0,2-3"),
        ("learner=5", "cores [5] are not available here (have [0, 1])"),
    ],
)
def test_a_bad_cpus_option_names_itself_and_what_to_write(value, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        parse_pinning([value], {0, 1})


def test_a_pinned_process_and_what_it_starts_run_on_its_cores_only(tmp_path):
    """The supervisor pins a process as it starts it; a child it starts later inherits the mask."""
    core = min(os.sched_getaffinity(0))
    child = "import os; print(sorted(os.sched_getaffinity(0)))"
    script = (
        "import os, subprocess, sys, time; time.sleep(0.3); print(sorted(os.sched_getaffinity(0)), "
        f"subprocess.check_output([sys.executable, '-c', {child!r}], text=True).strip(), flush=True)"
    )
    spec = ProcessSpec(
        "learner",
        "learner",
        [sys.executable, "-c", script],
        log=tmp_path / "l.log",
        cpus=frozenset({core}),
    )
    supervisor = Supervisor([spec], retry_budget=0, log=lambda _: None)
    supervisor.start("learner")
    supervisor.managed["learner"].proc.wait(30)
    assert (tmp_path / "l.log").read_text().split() == [f"[{core}]", f"[{core}]"]


LINE = {"step": 12, "reward_mean": 0.4123, "solve_rate": 0.375, "tokens_per_s": 2103.4, "staleness_mean": 0.5}


def test_progress_line():
    text = progress_line(LINE, 48, elapsed=372, seconds_per_step=10.0)
    assert "step 12/48" in text and "reward 0.412" in text and "solve 38%" in text and "2103 tok/s" in text
    assert "staleness 0.5" in text and "6m12s" in text and "ETA 6m00s" in text
    assert duration(3 * 3600 + 125) == "3h02m" and duration(None) == "?"


def test_progress_printer_rewrites_a_line_on_a_terminal_and_prints_lines_elsewhere():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        printer = ProgressPrinter(stream)
        printer.update("a")
        printer.update("b")
        printer.message("event")
    assert log.getvalue() == "a\nb\nevent\n"
    assert tty.getvalue() == "\r\x1b[Ka\r\x1b[Kb\nevent\n"


def test_learning_curve_png(tmp_path):
    lines = [
        {"step": s, "reward_mean": s / 10, "solve_rate": s / 20, "time": 1000.0 + 5 * s, "step_s": 5.0}
        for s in range(1, 11)
    ]
    out = plot_learning_curve(lines, tmp_path / "curve.png", "demo", {"after warm-up": 0.1, "after RL": 0.8})
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert plot_learning_curve([], tmp_path / "none.png", "demo") is None
