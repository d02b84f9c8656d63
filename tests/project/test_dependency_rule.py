"""The dependency rule (docs/architecture.md): the tiers meet only in `kuberl/api`.

A tier package never imports another tier package, lazily or not; the shared `kuberl` modules (the contract
in `kuberl/api`, and libraries such as `kuberl.modeling`, `kuberl.suites`, `kuberl.kube`) import no tier; only
the composition roots, `kuberl/cli.py` and `kuberl/local/`, put tiers together. Checked on the source's import
statements (in the spirit of import-linter's contracts), so a new cross-tier import fails here with its file
and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TIERS = {
    "kuberl_operator": REPO / "operator" / "kuberl_operator",
    "kuberl_trainer": REPO / "trainer" / "kuberl_trainer",
    "kuberl_rollout": REPO / "rollout-server" / "kuberl_rollout",
    "kuberl_sandbox": REPO / "env-images" / "kuberl_sandbox",
}
COMPOSITION_ROOTS = ("kuberl.cli", "kuberl.local")


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in a file, function-level ones included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def breaks_rule(owner: str, module: str) -> bool:
    """Whether package `owner` (a tier, or 'kuberl' for the shared modules) may not import `module`."""
    if top(module) in TIERS:
        return top(module) != owner
    return module.startswith(COMPOSITION_ROOTS)  # a tier or a shared module reaching into a composition root


def violations() -> list[str]:
    found = []
    shared = [p for p in (REPO / "kuberl").rglob("*.py") if not p.is_relative_to(REPO / "kuberl" / "local")]
    owned = [(tier, p) for tier, folder in TIERS.items() for p in folder.rglob("*.py")]
    owned += [("kuberl", p) for p in shared if p.name != "cli.py" or p.parent != REPO / "kuberl"]
    for owner, path in owned:
        for line, module in imported_modules(path):
            if breaks_rule(owner, module):
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return sorted(found)


def test_no_tier_imports_another_tier_or_a_composition_root():
    problems = violations()
    assert problems == [], "cross-tier imports (move the shared part to kuberl/api):\n" + "\n".join(problems)


def test_the_check_sees_lazy_imports(tmp_path):
    """The check must catch an import inside a function, the usual way such imports hide."""
    sample = tmp_path / "sample.py"
    sample.write_text("def f():\n    from kuberl_operator.handlers import x\n    import kuberl_sandbox.api\n")
    assert [m for _, m in imported_modules(sample)] == ["kuberl_operator.handlers", "kuberl_sandbox.api"]
    assert breaks_rule("kuberl_trainer", "kuberl_operator.handlers") and not breaks_rule("kuberl_trainer", "kuberl.api")
    assert breaks_rule("kuberl_trainer", "kuberl.local.runner") and not breaks_rule(
        "kuberl_trainer", "kuberl_trainer.x"
    )
