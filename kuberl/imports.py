"""What a `module:name` reference in an RLJob names (a reward function, an agent, an environment class)."""

from __future__ import annotations

import importlib


def import_reference(ref: str, what: str, form: str = "module:name") -> object:
    """The attribute `ref` (`module:name`) names; ValueError that starts with `what` and `ref` and says why when
    there is none."""
    module_name, _, attr = ref.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{what} {ref!r}: expected {form}")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # a module that fails while importing is as unusable as a missing one
        raise ValueError(
            f"{what} {ref!r}: cannot import module {module_name!r} ({type(err).__name__}: {err})"
        ) from None
    if not hasattr(module, attr):
        raise ValueError(f"{what} {ref!r}: module {module_name!r} has no attribute {attr!r}")
    return getattr(module, attr)
