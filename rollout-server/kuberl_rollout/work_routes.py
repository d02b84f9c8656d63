"""The learner's work API: submit task groups, follow or cancel them, take finished trajectories, announce the
next submissions (so the operator warms their sandbox images' pools).

Bodies are the models of `kuberl.api.rollout_http`, which the learner's client uses too; every route asks for the
job token.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from kuberl.api.rollout_http import (
    AcceptedGroup,
    GroupInfo,
    Problem,
    SubmitGroup,
    Trajectories,
    TrajectoryQuery,
    UpcomingSessions,
    UpcomingTasks,
)
from kuberl_rollout.auth import JOB_TOKEN
from kuberl_rollout.state import State

router = APIRouter(
    prefix="/v1",
    tags=["work"],
    dependencies=JOB_TOKEN,
    responses={code: {"model": Problem} for code in (400, 401, 404, 422, 429, 503)},
)


@router.post("/groups", status_code=202)
async def submit(body: SubmitGroup, s: State) -> AcceptedGroup:
    group = s.service.submit(body.task_id, body.task, body.group_size, body.seed)
    return AcceptedGroup(
        **group.describe().model_dump(), boot_id=s.service.boot_id, policy_version=s.service.agent.engine.version
    )


@router.get("/groups/{group_id}")
async def describe(group_id: str, s: State) -> GroupInfo:
    return s.service.describe(group_id)


@router.delete("/groups/{group_id}")
async def cancel(group_id: str, s: State) -> GroupInfo:
    return s.service.cancel(group_id)


@router.get("/trajectories")
async def trajectories(query: Annotated[TrajectoryQuery, Query()], s: State) -> Trajectories:
    found = await s.service.take(query.limit, query.wait)
    return Trajectories(boot_id=s.service.boot_id, trajectories=found)


@router.post("/upcoming")
async def upcoming(body: UpcomingTasks, s: State) -> UpcomingSessions:
    return s.service.announce([(t.task_id, t.episodes) for t in body.tasks])
