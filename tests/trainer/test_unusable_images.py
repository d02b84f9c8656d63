"""Sandbox images, the learner's side: tasks whose image the operator found unusable are left out of the draw (a
group of them that failed is not run again), the learner stops with NoUsableImages when none is left, the RLJob's
pools are read at most every 30 s, and the next step's tasks are announced to the rollout servers."""

from __future__ import annotations

import json

import httpx
from test_cluster_status import RecordingKube
from test_rollout_feed import WorkQueue, feed

from kuberl.api.breakers import phase_for
from kuberl.api.status import Reason, SandboxPoolStatus
from kuberl_trainer.cluster_status import ClusterStatus
from kuberl_trainer.rollout_client import RolloutClient
from kuberl_trainer.unusable_images import UnusableImages, cluster_unusable_images

TASKS = [f"t{i}" for i in range(10)]
BROKEN, FINE = "ghcr.io/acme/broken:1", "ghcr.io/acme/fine:1"


def pool(image: str, unusable: bool = False, reason: str | None = None) -> SandboxPoolStatus:
    message = "pull access denied" if reason else None
    return SandboxPoolStatus(image=image, pool="p", unusable=unusable, reason=reason, message=message)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def finish_batch(queue: WorkQueue, version: int = 0):
    """The feed's `stop`: the open groups finish at `version` while the feed waits."""
    polls = iter(range(1000))

    def stop() -> bool:
        if next(polls) == 1:
            queue.finish(version=version)
        return False

    return stop


# ---------------------------------------------------------------------------------------------- the feed
def test_the_feed_passes_over_tasks_whose_image_is_unusable():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    f.usable = lambda task_id: task_id not in {"t0", "t2"}
    f.next_batch(version=0, stop=finish_batch(queue), poll=0)
    assert [(g.task_id, g.seed) for g in queue.submitted] == [("t1", 101), ("t3", 103)]  # a seed per draw
    assert f.cursor == 4


def test_a_failed_group_of_an_unusable_image_is_not_run_again_and_its_failures_are_left_out():
    queue = WorkQueue()
    f = feed(queue, asynchronous=False)
    usable = {t: True for t in TASKS}
    f.usable = usable.__getitem__

    def stop() -> bool:  # t0's image turns unusable while its group runs; the first member of each group fails
        first = usable["t0"]
        usable["t0"] = False
        queue.finish(version=0, error_first=first)
        return False

    batch = f.next_batch(version=0, stop=stop, poll=0)
    assert [g.task_id for g in queue.submitted] == ["t0", "t1", "t1"]  # t1 is run again, t0 is not
    assert batch.failed == 1 and all(t.error is None for t in batch.trajectories)
    assert [t.task_id for t in batch.trajectories] == ["t0", "t1", "t1"]  # t0's failed member is left out


def test_a_resubmission_of_an_unusable_task_is_replaced_by_the_next_draw():
    queue = WorkQueue(servers=2)
    f = feed(queue, asynchronous=True, max_staleness=0)
    f.next_batch(version=0, stop=finish_batch(queue), poll=0)
    assert {g.task_id for g in queue.open} == {"t2", "t3"}
    f.usable = lambda task_id: task_id != "t2"
    queue.crash(next(g.server for g in queue.open if g.task_id == "t2"))
    f.next_batch(version=1, stop=finish_batch(queue, version=1), poll=0)
    again = [g.task_id for g in queue.submitted[4:]]
    assert again[0] == "t4" and "t2" not in again  # the lost group's task is unusable: the next draw instead


def test_the_next_steps_tasks_are_announced_after_each_batch_without_moving_the_cursor():
    queue = WorkQueue()
    announced: list[list[tuple[str, int]]] = []
    f = feed(queue, asynchronous=False)
    f.usable = lambda task_id: task_id != "t3"
    f.announce = announced.append
    polls = iter(range(1000))

    def stop() -> bool:  # one group finishes at each poll; nothing is announced while one still runs
        assert announced == []
        if next(polls) >= 1:
            queue.finish(version=0, count=1)
        return False

    f.next_batch(version=0, stop=stop, poll=0)
    assert announced == [[("t2", 2), ("t4", 2)]]  # the next sync wave: two groups of two episodes
    cursor = f.cursor
    f.next_batch(version=1, stop=finish_batch(queue, version=1), poll=0)
    assert [g.task_id for g in queue.submitted[2:]] == ["t2", "t4"] and cursor == 2  # what was announced came
    assert announced[-1] == [("t5", 2), ("t6", 2)]


# ------------------------------------------------------------------------------------- reading the pools
def test_pools_are_read_at_most_every_30_seconds_and_tasks_mapped_only_once_an_image_is_unusable():
    reads: list[list[SandboxPoolStatus]] = [[pool(FINE)], [pool(FINE), pool(BROKEN, True, "ImagePullBackOff")]]
    loads, counts, clock = [], [], Clock()

    def load_images() -> dict[str, str | None]:
        loads.append(1)
        return {t: (BROKEN if t in {"t0", "t1"} else FINE if t == "t2" else None) for t in TASKS}

    gate = UnusableImages(TASKS, lambda: reads.pop(0), load_images, clock=clock, on_count=counts.append)
    assert gate.usable("t0") and loads == []  # no image is unusable: tasks are not mapped
    clock.now = 29.0
    assert gate.usable("t0") and reads  # not read again yet
    clock.now = 30.0
    assert not gate.usable("t0") and not gate.usable("t1") and gate.usable("t2") and gate.usable("t3")
    assert loads == [1] and counts == [0, 2] and gate.stop() is None


def test_the_learner_stops_when_no_training_task_has_a_usable_image():
    images = {t: BROKEN if t < "t5" else FINE for t in TASKS}
    pools = [pool(BROKEN, True, "ImagePullBackOff"), pool(FINE, True, "CrashLoopBackOff")]
    gate = UnusableImages(TASKS, lambda: pools, lambda: images)
    stop = gate.stop()
    assert stop is not None and stop.reason == Reason.NO_USABLE_IMAGES
    assert stop.phase == phase_for(Reason.NO_USABLE_IMAGES)
    assert f"{BROKEN} (ImagePullBackOff: pull access denied)" in stop.message
    assert f"{FINE} (CrashLoopBackOff: pull access denied)" in stop.message


def test_a_pool_list_that_cannot_be_read_keeps_what_was_known():
    answers = [[pool(BROKEN, True, "MissingShell")], None]
    clock = Clock()
    gate = UnusableImages(TASKS, lambda: answers.pop(0), lambda: dict.fromkeys(TASKS, BROKEN), clock=clock)
    assert gate.stop() is not None
    clock.now = 60.0
    assert gate.stop() is not None and answers == []


def test_the_learner_reads_the_pools_from_its_rljob_and_locally_leaves_nothing_out():
    stored = {"status": {"sandboxPools": [{"image": BROKEN, "pool": "j-sbx-1", "unusable": True}, {"image": ""}]}}
    cluster = ClusterStatus(RecordingKube(stored), "team", "j")
    assert cluster.sandbox_pools() == [SandboxPoolStatus(image=BROKEN, pool="j-sbx-1", unusable=True)]

    class Down(RecordingKube):
        def get(self, path: str) -> dict:
            raise RuntimeError("API down")

    assert ClusterStatus(Down(), "team", "j").sandbox_pools() is None
    assert cluster_unusable_images(None, TASKS, None, print) is None


# ---------------------------------------------------------------------------------- announcing, over HTTP
def test_the_announcement_is_split_among_the_servers_and_an_older_server_is_not_asked_again():
    bodies: dict[str, list[dict]] = {"a": [], "b": []}

    def server(request: httpx.Request) -> httpx.Response:
        if request.url.host == "b":
            return httpx.Response(404, json={"detail": "Not Found"})
        bodies["a"].append(json.loads(request.content))
        return httpx.Response(200, json={"sessions": {"": 2}, "unknown": 0})

    client = RolloutClient(["http://a", "http://b", "http://c"], "token")
    client.down.add(2)
    client.http = [
        httpx.Client(base_url=u, transport=httpx.MockTransport(server)) for u in ("http://a", "http://b", "http://c")
    ]
    client.announce([("t0", 2), ("t1", 2), ("t2", 2)])
    assert bodies["a"] == [{"tasks": [{"taskId": "t0", "episodes": 2}, {"taskId": "t2", "episodes": 2}]}]
    assert client.without_upcoming == {1}
    client.announce([("t3", 2)])
    assert bodies["a"][-1] == {"tasks": [{"taskId": "t3", "episodes": 2}]}  # all of it to the one that takes it
