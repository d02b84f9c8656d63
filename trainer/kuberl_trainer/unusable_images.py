"""Training tasks whose sandbox image cannot run, left out of the draw.

On a cluster the operator marks an image's pool `unusable` in the RLJob's status.sandboxPools (its image cannot
be pulled, its pods crash, it lacks a shell). The learner reads that list at most every `interval_s`, and the
feed stops drawing the tasks whose episodes run in such an image: their episodes could only fail (and be
masked). When no training task is left, the learner stops with NoUsableImages, naming the images and why.
Tasks are mapped to images only once an image is unusable, so a job without per-image pools never loads them
twice. Locally there is no status to read and nothing is left out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from kuberl.api.breakers import Stop, phase_for
from kuberl.api.environment import Task
from kuberl.api.rljob import RLJob
from kuberl.api.sandbox_images import ImageTemplateError, episode_image
from kuberl.api.status import Reason, SandboxPoolStatus
from kuberl.suites import environment_tasks

log = logging.getLogger(__name__)

READ_INTERVAL_S = 30.0
"""How often the learner reads its RLJob's sandbox pools: images turn unusable in minutes, not seconds."""
NAMED_IMAGES = 5
"""Images a stop message names (with their reasons), the rest counted."""


class UnusableImages:
    """Which of `task_ids` may still be drawn, from the pools `read_pools` reports (None: could not read, the
    previous answer holds) and the task -> image map `load_images` gives (None: the job's default image)."""

    def __init__(
        self,
        task_ids: list[str],
        read_pools: Callable[[], list[SandboxPoolStatus] | None],
        load_images: Callable[[], dict[str, str | None]],
        interval_s: float = READ_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        on_count: Callable[[int], None] | None = None,
    ) -> None:
        self.task_ids = task_ids
        self.read_pools, self.load_images = read_pools, load_images
        self.interval_s, self.clock = interval_s, clock
        self.on_count = on_count
        """Told how many training tasks are left out, after every read (the learner's metric)."""
        self.unusable: dict[str, SandboxPoolStatus] = {}  # image -> its pool's status
        self.left_out: set[str] = set()  # training tasks whose image is unusable
        self._images: dict[str, str | None] | None = None
        self._read_at: float | None = None

    def usable(self, task_id: str) -> bool:
        """Whether `task_id` may be drawn (re-reading the pools when they are due)."""
        self.refresh()
        return task_id not in self.left_out

    def refresh(self) -> None:
        """Read the pools, at most every `interval_s`."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < self.interval_s:
            return
        self._read_at = now
        pools = self.read_pools()
        if pools is None:
            return
        unusable = {p.image: p for p in pools if p.unusable}
        if unusable.keys() != self.unusable.keys():
            self._left_out_for(unusable)
        self.unusable = unusable
        if self.on_count is not None:
            self.on_count(len(self.left_out))

    def stop(self) -> Stop | None:
        """NoUsableImages once every training task's image is unusable; None while one is left."""
        self.refresh()
        if not self.task_ids or len(self.left_out) < len(set(self.task_ids)):
            return None
        used = sorted({self._images[t] for t in self.task_ids if self._images and self._images.get(t)})
        named = [_describe(self.unusable[i]) for i in used[:NAMED_IMAGES] if i in self.unusable]
        more = f" and {len(used) - NAMED_IMAGES} more" if len(used) > NAMED_IMAGES else ""
        message = f"no training task has a usable sandbox image: {'; '.join(named)}{more}"
        return Stop(phase_for(Reason.NO_USABLE_IMAGES), Reason.NO_USABLE_IMAGES, message[:1024])

    def _left_out_for(self, unusable: dict[str, SandboxPoolStatus]) -> None:
        if unusable and self._images is None:
            self._images = self.load_images()
        images = self._images or {}
        before = len(self.left_out)
        self.left_out = {t for t in self.task_ids if images.get(t) in unusable}
        if len(self.left_out) != before:
            log.warning(
                "%d of %d training tasks left out: their sandbox images are unusable (%s)",
                len(self.left_out),
                len(set(self.task_ids)),
                ", ".join(_describe(p) for p in list(unusable.values())[:NAMED_IMAGES]),
            )


def _describe(pool: SandboxPoolStatus) -> str:
    why = ": ".join(x for x in (pool.reason, pool.message) if x) or "unusable"
    return f"{pool.image} ({why})"


def cluster_unusable_images(job: RLJob, task_ids: list[str], cluster, on_count: Callable[[int], None]):
    """The learner's `UnusableImages` in a cluster (`cluster`: its ClusterStatus, which reads the RLJob);
    None locally, where nothing is left out."""
    if cluster is None:
        return None

    def load_images() -> dict[str, str | None]:
        env = job.spec.environment
        return {t.task_id: _image(t, job) for t in environment_tasks(env, str(env.tasks.split))}

    return UnusableImages(task_ids, cluster.sandbox_pools, load_images, on_count=on_count)


def _image(task: Task, job: RLJob) -> str | None:
    try:
        return episode_image(task, job.spec.sandbox)
    except ImageTemplateError:  # such a task's groups fail at the rollout server, which names the field
        return None
