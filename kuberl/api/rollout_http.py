"""The rollout server's work API: request and response bodies, used by the server and its client alike.

The rollout server (`kuberl rollout-server`, rollout-server/kuberl_rollout/*_routes.py) validates requests
with these models and answers with them; the learner's client (`kuberl_trainer.rollout_client`) builds its
requests and reads the answers with the same models, so a field renamed on one side fails on both. The keys
on the wire are camelCase (docs/rollout.md). Requests refuse unknown fields; answers ignore them, so a
learner keeps reading the answers of a newer server that adds one. The OpenAI-compatible endpoints follow
OpenAI's format and are not part of this contract.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from kuberl.api.environment import Task
from kuberl.api.trajectory import Trajectory

MAX_GROUP_SIZE = 1024
MAX_TRAJECTORIES_PER_POLL = 4096
MAX_POLL_WAIT_S = 300.0
MAX_BUCKETS = 100_000
MAX_UPCOMING_TASKS = 4096


class RolloutRequest(BaseModel):
    """camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def wire(self) -> dict:
        """The JSON body (or query) as sent: camelCase keys, unset optional fields left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class RolloutReply(BaseModel):
    """camelCase on the wire, unknown fields ignored (a newer server may add some)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore")


# ------------------------------------------------------------------------------------------- groups
class SubmitGroup(RolloutRequest):
    """`POST /v1/groups`: `groupSize` episodes of one task, named (`taskId`, a task the server loaded) or
    given inline (`task`, e.g. a held-out task the server need not know)."""

    task_id: str | None = None
    task: Task | None = None
    group_size: int = Field(ge=1, le=MAX_GROUP_SIZE)
    seed: int | None = None
    """Episode i of the group samples with seed `seed * 1000 + i` (None: unseeded)."""

    @model_validator(mode="after")
    def _one_task(self) -> Self:
        if (self.task_id is None) == (self.task is None):
            raise ValueError("give exactly one of taskId or task")
        return self


class GroupInfo(RolloutReply):
    """`GET` and `DELETE /v1/groups/{id}`: where the group's episodes stand."""

    group_id: str
    task_id: str
    size: int
    finished: int
    failed: int
    running: int
    cancelled: bool


class AcceptedGroup(GroupInfo):
    """`POST /v1/groups` (202): the group, and which server boot and policy version accepted it."""

    boot_id: str
    policy_version: int


# ------------------------------------------------------------------------------------- trajectories
class TrajectoryQuery(RolloutRequest):
    """`GET /v1/trajectories?wait=&limit=`: up to `limit` finished trajectories, waiting up to `wait`
    seconds for the first (long-poll) while an episode is open; a server with none open answers at once."""

    model_config = ConfigDict(extra="ignore")  # a query string may carry parameters of other tools

    wait: float = Field(0.0, ge=0, le=MAX_POLL_WAIT_S)
    limit: int = Field(64, ge=1, le=MAX_TRAJECTORIES_PER_POLL)


class Trajectories(RolloutReply):
    """Finished trajectories, each delivered once, and the boot id of the server (a new one: it restarted
    and lost its groups)."""

    boot_id: str
    trajectories: list[Trajectory]


# ------------------------------------------------------------------------------------------ upcoming
class UpcomingTask(RolloutRequest):
    """A task the learner will submit next, and how many of its episodes."""

    task_id: str = Field(min_length=1)
    episodes: int = Field(ge=1, le=MAX_GROUP_SIZE)


class UpcomingTasks(RolloutRequest):
    """`POST /v1/upcoming`: the tasks of the learner's next submissions to this server, replacing the previous
    announcement (an empty list withdraws it). The server exports them per sandbox image
    (`kuberl_rollout_upcoming_sessions`), so the operator warms the images' pools before the episodes queue."""

    tasks: list[UpcomingTask] = Field(default_factory=list, max_length=MAX_UPCOMING_TASKS)


class UpcomingSessions(RolloutReply):
    """The announcement as the server counts it: episodes per sandbox image ("" the job's default servers),
    and how many of the tasks it does not know (left out)."""

    sessions: dict[str, int]
    unknown: int = 0


# ------------------------------------------------------------------------------------------ weights
class Policy(RolloutReply):
    """`GET /v1/policy`: the weights' version the server samples with."""

    version: int
    boot_id: str


class BucketQuery(RolloutRequest):
    """`PUT /v1/weights/{version}/buckets/{index}?of=N`: bucket `index` of the N of a weight update."""

    model_config = ConfigDict(extra="ignore")

    of: int = Field(ge=1, le=MAX_BUCKETS)


class BucketReceipt(RolloutReply):
    """How many buckets of `version` arrived; `applied` once the last one did and the weights are served."""

    version: int
    received: int
    of: int
    applied: bool


class LoadWeights(RolloutRequest):
    """`POST /v1/weights/load`: a safetensors folder written by the learner (local path, file:// or s3://)."""

    uri: str = Field(min_length=1)
    version: int = Field(ge=1)


class WeightsLoaded(RolloutReply):
    version: int
    applied: bool


# ------------------------------------------------------------------------------------------- errors
class Problem(RolloutReply):
    """Every 4xx and 5xx answer of the work API."""

    detail: str
