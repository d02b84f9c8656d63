"""Weight updates: the served version, bucketed uploads from the learner (streamed to staging files), and loads
from storage.

Bodies are the models of `kuberl.api.rollout_http`, which the learner's client uses too; every route asks for the
job token (an upload is refused before a byte of it is staged).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated

from fastapi import APIRouter, Query, Request

from kuberl.api.rollout_http import BucketQuery, BucketReceipt, LoadWeights, Policy, Problem, WeightsLoaded
from kuberl_rollout.auth import JOB_TOKEN
from kuberl_rollout.service import WorkError
from kuberl_rollout.state import State
from kuberl_rollout.weights import WeightError

router = APIRouter(
    prefix="/v1",
    tags=["weights"],
    dependencies=JOB_TOKEN,
    responses={code: {"model": Problem} for code in (400, 401, 422, 503)},
)


@router.get("/policy")
async def policy(s: State) -> Policy:
    return Policy(version=s.service.agent.engine.version, boot_id=s.service.boot_id)


@router.put("/weights/{version}/buckets/{index}", status_code=202)
async def upload_bucket(
    version: int, index: int, query: Annotated[BucketQuery, Query()], request: Request, s: State
) -> BucketReceipt:
    body = _counted(request, s.metrics.weight_sync_bytes.inc)
    engine = s.service.agent.engine
    if not await s.assembler.stage(version, index, query.of, body, engine.version):
        return BucketReceipt(version=version, received=len(s.assembler.buckets), of=query.of, applied=False)
    files = s.assembler.take()
    started = time.monotonic()
    try:
        await s.serve_weights(files, version)
    finally:
        s.assembler.discard()
    s.metrics.weight_sync_seconds.observe(time.monotonic() - started)
    s.metrics.policy_version.set(version)
    return BucketReceipt(version=version, received=query.of, of=query.of, applied=True)


async def _counted(request: Request, count: Callable[[int], None]) -> AsyncIterator[bytes]:
    """The request body as it arrives, each chunk counted (weight_sync_bytes)."""
    async for chunk in request.stream():
        count(len(chunk))
        yield chunk


@router.post("/weights/load")
async def load_weights(body: LoadWeights, s: State) -> WeightsLoaded:
    from kuberl.storage import LocalCopyError, local_copy

    engine = s.service.agent.engine
    if body.version <= engine.version:
        raise WeightError(f"version {body.version} is not newer than the served version {engine.version}")
    try:
        folder = await asyncio.to_thread(local_copy, body.uri)  # an S3 download must not stall serving
    except LocalCopyError as err:
        raise WorkError(400, str(err)) from None
    try:
        files = s.assembler.check_folder(folder)
        started = time.monotonic()
        await s.serve_weights(files, body.version)
    finally:
        if body.uri.startswith("s3://"):  # a downloaded version is not needed once served
            shutil.rmtree(folder, ignore_errors=True)
    s.metrics.weight_sync_seconds.observe(time.monotonic() - started)
    s.metrics.policy_version.set(body.version)
    return WeightsLoaded(version=body.version, applied=True)
