"""Commands, test runs and tool calls."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from kuberl.api.environment import StepResult, ToolCall
from kuberl.api.sandbox_http import ExecRequest, ExecResponse, TestsRequest
from kuberl_sandbox.execution import CommandResult
from kuberl_sandbox.routes.deps import AUTHENTICATED, Manager, SessionOf
from kuberl_sandbox.tools import apply_tool

router = APIRouter(dependencies=AUTHENTICATED)


def exec_response(result: CommandResult) -> ExecResponse:
    return ExecResponse(
        exit_code=result.exit_code,
        output=result.output,
        truncated=result.truncated,
        timed_out=result.timed_out,
        duration_s=result.duration_s,
    )


@router.post("/v1/sessions/{session_id}/exec")
async def execute(session: SessionOf, manager: Manager, body: ExecRequest) -> ExecResponse:
    return exec_response(await manager.execute(session, body.command, body.timeout))


@router.post("/v1/sessions/{session_id}/tests")
async def run_tests(session: SessionOf, manager: Manager, body: TestsRequest | None = None) -> dict[str, Any]:
    outcome = await manager.run_tests(session, hidden=bool(body and body.hidden))
    return {**outcome.as_info(), "output": outcome.output}


@router.post("/v1/sessions/{session_id}/step")
async def step(session: SessionOf, manager: Manager, call: ToolCall) -> StepResult:
    return await apply_tool(manager, session, call)
