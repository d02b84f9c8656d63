"""The dependency rule (the house): three floors, and no two modules that import each other.

The ground, `kuberl/` (the contract in `kuberl/api` and the libraries every tier shares), imports no tier and
not the composition roots. Each tier (operator, trainer, rollout-server, env-images) imports only `kuberl`,
never another tier nor the composition roots. On top, two rooms: `kuberl_app` (app/: the `kuberl` command line
and the one-machine runner), the only package that puts tiers together to run a job, and `recipes` (what a team
brings for one kind of task: its model, its demonstrations, its reports), which uses the tiers as a library;
nothing below imports either, nor does either import the other. Across every package, two modules never
import each other: what both need goes to a module of its own. Checked on the source's import statements
(function-level and TYPE_CHECKING ones included; in the spirit of import-linter's contracts), so a new import
that breaks a rule fails here with its file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED, APP, RECIPES = "kuberl", "kuberl_app", "recipes"
TOP_FLOOR = (APP, RECIPES)
TIERS = {
    "kuberl_operator": REPO / "operator" / "kuberl_operator",
    "kuberl_trainer": REPO / "trainer" / "kuberl_trainer",
    "kuberl_rollout": REPO / "rollout-server" / "kuberl_rollout",
    "kuberl_sandbox": REPO / "env-images" / "kuberl_sandbox",
}
PACKAGES = {SHARED: REPO / "kuberl", **TIERS, APP: REPO / "app" / "kuberl_app", RECIPES: REPO / "recipes"}


def module_files(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of the packages by dotted name (a package by its own name, for its __init__.py)."""
    modules = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_names(module: str, path: Path) -> list[tuple[int, str]]:
    """(line, dotted name) of everything a file imports, function-level imports included: `import a.b` gives
    a.b, `from a import b` gives a.b (a module or a name in a); relative imports are made absolute."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, *([node.module] if node.module else [])])
            found += [(node.lineno, f"{source}.{alias.name}") for alias in node.names]
    return found


def top(name: str) -> str:
    return name.split(".")[0]


def breaks_rule(owner: str, name: str) -> bool:
    """Whether package `owner` may not import `name`: only the top floor (the composition roots, the recipes)
    imports a tier of another owner, and nothing imports a room of the top floor but that room itself."""
    if top(name) in TOP_FLOOR:
        return top(name) != owner
    if owner in TOP_FLOOR:
        return False
    return top(name) in TIERS and top(name) != owner


def floor_violations(packages: dict[str, Path], root: Path) -> list[str]:
    """Imports that break the floors: `kuberl` importing a tier or the top floor, a tier another tier or the top
    floor, one room of the top floor the other."""
    found = []
    for module, path in module_files(packages).items():
        for line, name in imported_names(module, path):
            if breaks_rule(top(module), name):
                found.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(found)


def import_graph(packages: dict[str, Path]) -> dict[str, dict[str, int]]:
    """Each module's imports of other modules of the packages, with the line of the first one."""
    modules = module_files(packages)
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, {})
        for line, name in imported_names(module, path):
            target = name
            while target and target not in modules:  # a name inside a module: that module
                target = target.rpartition(".")[0]
            if target and target != module:
                edges.setdefault(target, line)
    return graph


def mutual_imports(packages: dict[str, Path], root: Path) -> list[str]:
    """Pairs of modules that import each other (a 2-cycle), each pair once, with both lines."""
    modules, graph = module_files(packages), import_graph(packages)
    found = []
    for a, edges in graph.items():
        for b, line in edges.items():
            if a < b and a in graph.get(b, {}):
                where_a, where_b = modules[a].relative_to(root), modules[b].relative_to(root)
                found.append(f"{where_a}:{line} imports {b} and {where_b}:{graph[b][a]} imports {a}")
    return sorted(found)


def test_kuberl_imports_no_tier_and_not_the_top_floor():
    problems = [p for p in floor_violations(PACKAGES, REPO) if p.startswith("kuberl/")]
    assert problems == [], "the shared floor reaches up (move the shared part into kuberl/):\n" + "\n".join(problems)


def test_no_tier_imports_another_tier_or_the_top_floor():
    problems = [p for p in floor_violations(PACKAGES, REPO) if not p.startswith(("kuberl/", "app/", "recipes/"))]
    assert problems == [], "cross-tier imports (move the shared part to kuberl/api):\n" + "\n".join(problems)


def test_the_composition_roots_and_the_recipes_do_not_import_each_other():
    problems = [p for p in floor_violations(PACKAGES, REPO) if p.startswith(("app/", "recipes/"))]
    assert problems == [], "the top floor's rooms import each other:\n" + "\n".join(problems)


def test_no_two_modules_import_each_other():
    problems = mutual_imports(PACKAGES, REPO)
    assert problems == [], "import cycles (move what both need into a module of its own):\n" + "\n".join(problems)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_the_check_sees_each_kind_of_violation(tmp_path):
    """Each rule on a small tree, with the imports hidden the usual ways: inside a function, under
    TYPE_CHECKING, as `from package import module`, relative."""
    _write(
        tmp_path,
        {
            "kuberl/__init__.py": "",
            "kuberl/shared.py": "def f():\n    from kuberl_trainer.loop import x\n",
            "kuberl/typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import kuberl_app.cli\n",
            "trainer/kuberl_trainer/__init__.py": "",
            "trainer/kuberl_trainer/loop.py": "from kuberl.shared import f\nfrom kuberl_trainer import probes\n",
            "trainer/kuberl_trainer/probes.py": "def g():\n    from .loop import x\n    import kuberl_operator.pods\n",
            "operator/kuberl_operator/__init__.py": "",
            "operator/kuberl_operator/pods.py": "from kuberl_app.one_machine import runner\n",
            "app/kuberl_app/__init__.py": "",
            "app/kuberl_app/cli.py": "import kuberl_operator.pods\nfrom kuberl_trainer.loop import x\n",
            "trainer/kuberl_trainer/data.py": "def h():\n    from recipes.toy import make\n",
            "recipes/__init__.py": "",
            "recipes/toy.py": "from kuberl_trainer.loop import x\nfrom kuberl_app.cli import main\n",
        },
    )
    packages = {
        SHARED: tmp_path / "kuberl",
        "kuberl_trainer": tmp_path / "trainer" / "kuberl_trainer",
        "kuberl_operator": tmp_path / "operator" / "kuberl_operator",
        APP: tmp_path / "app" / "kuberl_app",
        RECIPES: tmp_path / "recipes",
    }
    assert floor_violations(packages, tmp_path) == [
        "kuberl/shared.py:2 imports kuberl_trainer.loop.x",
        "kuberl/typed.py:3 imports kuberl_app.cli",
        "operator/kuberl_operator/pods.py:1 imports kuberl_app.one_machine.runner",
        "recipes/toy.py:2 imports kuberl_app.cli.main",
        "trainer/kuberl_trainer/data.py:2 imports recipes.toy.make",
        "trainer/kuberl_trainer/probes.py:3 imports kuberl_operator.pods",
    ]
    # kuberl.shared -> kuberl_trainer.loop -> kuberl.shared is a cycle too, but the floors already refuse it
    assert mutual_imports(packages, tmp_path) == [
        "kuberl/shared.py:2 imports kuberl_trainer.loop and trainer/kuberl_trainer/loop.py:1 imports kuberl.shared",
        "trainer/kuberl_trainer/loop.py:2 imports kuberl_trainer.probes and "
        "trainer/kuberl_trainer/probes.py:2 imports kuberl_trainer.loop",
    ]
