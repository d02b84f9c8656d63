"""How pytest-xdist's workers share the suite (`-n N --dist loadfile`, pyproject.toml): a file's tests stay on one
worker, so a module fixture (a tiny model trained, a server, a cluster) is built once, as in a serial run; the files
that take minutes are handed out first, so none of them starts last and finishes the run alone."""

from __future__ import annotations

from xdist.scheduler import LoadFileScheduling

# The suite's longest files, longest first (pytest --durations on 2 cores); other files follow in xdist's order.
LONG_FIRST = (
    "tests/local/test_run.py",
    "tests/cluster/test_end_to_end.py",
    "tests/swebench/test_swe_bench_job.py",
    "tests/trainer/test_learning.py",
    "tests/rollout/test_openenv_training.py",
    "tests/recipes/test_copy_pretraining.py",
    "tests/trainer/test_learner_loop.py",
    "tests/local/test_preemption.py",
    "tests/cluster/test_per_image_pools.py",
    "tests/cluster/test_chart_operator.py",
    "tests/sandbox/test_api_fuzz.py",
    "tests/images/test_foreign_image.py",
    "tests/images/test_operator_image.py",
    "tests/images/test_image_python.py",
    "tests/monitoring/test_live_prometheus.py",
    "tests/rollout/test_rollout_server.py",
    "tests/operator/test_operator_kmock.py",
    "tests/trainer/test_lora_learner_loop.py",
    "tests/trainer/test_resume.py",
    "tests/cli/test_validate_command.py",
    "tests/swebench/test_repository_tasks.py",
    "tests/rollout/test_mini_swe_agent.py",
)


def _file(scope: str) -> str:
    return scope.split("::", 1)[0]


class LongestFirstFileScheduling(LoadFileScheduling):
    """xdist's loadfile scheduling with LONG_FIRST's files at the head of the queue."""

    def _assign_work_unit(self, node) -> None:
        rank = {path: index for index, path in enumerate(LONG_FIRST)}
        head = min(self.workqueue, key=lambda scope: rank.get(_file(scope), len(rank)))
        self.workqueue.move_to_end(head, last=False)
        super()._assign_work_unit(node)
