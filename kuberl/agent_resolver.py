"""External agents named in the RLJob (`spec.environment.agent: module:function`): found and checked here,
by `kuberl validate` as by the rollout server that runs them (kuberl_rollout.external_agent)."""

from __future__ import annotations

import inspect

from kuberl.api.agents import AgentEntryPoint
from kuberl.imports import import_reference


def resolve_agent(ref: str) -> AgentEntryPoint:
    """The async entry point `ref` (`module:function`) names; ValueError saying why when there is none."""
    fn = import_reference(ref, "agent", "module:function")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"agent {ref!r}: {ref.partition(':')[2]!r} must be an async function (task, base_url, env)")
    return fn  # type: ignore[no-any-return]
