"""External agents named in the RLJob (`spec.environment.agent: module:function`): found and checked here,
by `kuberl validate` as by the rollout server that runs them (kuberl_rollout.external_agent)."""

from __future__ import annotations

import importlib
import inspect

from kuberl.api.agents import AgentEntryPoint


def resolve_agent(ref: str) -> AgentEntryPoint:
    """The async entry point `ref` (`module:function`) names; ValueError saying why when there is none."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"agent {ref!r}: expected module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a module that fails while importing is as unusable as a missing one
        raise ValueError(f"agent {ref!r}: cannot import module {module_name!r} ({type(err).__name__}: {err})") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"agent {ref!r}: module {module_name!r} has no attribute {attr!r}")
    if not inspect.iscoroutinefunction(fn):
        raise ValueError(f"agent {ref!r}: {attr!r} must be an async function (task, base_url, env)")
    return fn  # type: ignore[no-any-return]
