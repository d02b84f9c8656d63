"""docs/benchmarks.md, generated from the measured results: the goals of `make bench` against the committed
baseline (benchmarks/baseline.json) and each file of benchmarks/measured/ (what it measures, its goal where it
has one, the numbers, the machine and commit, and its plots in docs/img).

The page is data rendered, never edited by hand; a test compares it with a fresh rendering. Regenerate with:
    .venv/bin/python benchmarks/docs_page.py --output docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MEASURED = HERE / "measured"
IMAGES = REPO / "docs" / "img"
PAGE = REPO / "docs" / "benchmarks.md"
COMMAND = ".venv/bin/python benchmarks/docs_page.py --output docs/benchmarks.md"

sys.path.insert(0, str(HERE))
import report as bench_report  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

TITLES = {
    "demo": "`make demo`: learning on swe-toy",
    "images": "Image builds (`make images`)",
    "lora_weight_sync": "LoRA against full fine-tuning: weight sync and learner",
    "memory_plan": "`kuberl plan` against measured learner memory",
    "node_agent_images": "The end-to-end suite's pods from real images",
    "sandbox_network": "A network namespace per sandbox session",
    "sandbox_pools": "Sandbox pools per image (simulated)",
    "swe_tasks": "SWE-bench-format tasks on real repositories",
    "test_suite": "`make test` on a fresh clone",
}
DESCRIBE = ("what", "how", "method", "command")  # prose keys, in this order, rendered as sentences
META = ("commit", "machine", "load", "time", "builder_commit")  # where and when, rendered on one line
NOTES = ("notes", "reading", "assumptions")  # remarks beside the numbers


def _text(value: Any) -> str:
    """One table cell or inline value."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_text(v)}" for k, v in value.items()) or "—"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _flat(value: Any) -> bool:
    """A value that fits in one cell: a scalar, a list of scalars or a small mapping of scalars."""
    if isinstance(value, list):
        return all(not isinstance(v, (dict, list)) for v in value)
    if isinstance(value, dict):
        return len(value) <= 12 and all(not isinstance(v, (dict, list)) for v in value.values())
    return True


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _records(named: dict[str, dict[str, Any]], first: str) -> list[str]:
    """A mapping or list of records with flat fields: one row per record, one column per field."""
    columns: list[str] = []
    for record in named.values():
        columns += [key for key in record if key not in columns and key not in META]
    rows = [[name] + [_text(record.get(c, "—")) for c in columns] for name, record in named.items()]
    return _table([first, *columns], rows)


def _meta_line(data: dict[str, Any]) -> list[str]:
    machine = data.get("machine")
    parts = []
    if isinstance(machine, dict):
        parts.append("machine: " + _text(machine))
    elif machine:
        parts.append(f"machine: {machine}")
    for key in ("commit", "builder_commit", "load"):
        if key in data:
            parts.append(f"{key.replace('_', ' ')}: `{data[key]}`" if "commit" in key else f"{key}: {data[key]}")
    return ["*" + "; ".join(parts) + ".*", ""] if parts else []


def _section(data: dict[str, Any], depth: int) -> list[str]:
    """The numbers of one mapping: its flat values in one table, then each nested part under a heading."""
    lines = _meta_line(data)
    skip = set(DESCRIBE) | set(META) | set(NOTES) | {k for k in data if k.startswith("goal")}
    flat = {k: v for k, v in data.items() if k not in skip and _flat(v)}
    if flat:
        lines += [*_table(["measure", "value"], [[k, _text(v)] for k, v in flat.items()]), ""]
    for key, value in data.items():
        if key in skip or key in flat:
            continue
        lines += [f"{'#' * depth} {key}", ""]
        lines += _nested(value, depth)
    return lines


def _nested(value: Any, depth: int) -> list[str]:
    items = dict(enumerate(value, 1)) if isinstance(value, list) else value
    if all(isinstance(v, dict) and all(_flat(x) for x in v.values()) for v in items.values()):
        return [*_records({str(k): v for k, v in items.items()}, "#" if isinstance(value, list) else ""), ""]
    if isinstance(value, dict):
        return _section(value, min(depth + 1, 6))
    lines: list[str] = []
    for number, item in items.items():
        lines += [f"{'#' * min(depth + 1, 6)} {number}", ""]
        lines += _section(item, min(depth + 2, 6)) if isinstance(item, dict) else [_text(item), ""]
    return lines


def _plots(stem: str, images: Path) -> list[str]:
    prefix = stem.replace("_", "-")
    found = sorted(p for p in images.glob("*.png") if p.stem.startswith(prefix)) if images.is_dir() else []
    return [f"![{p.stem}](img/{p.name})" for p in found] + ([""] if found else [])


def _goal_lines(data: dict[str, Any]) -> list[str]:
    goals = [f"{k.replace('_', ' ')}: {_text(v)}" for k, v in data.items() if k.startswith("goal")]
    return [f"**Goal**: {'; '.join(goals)}.", ""] if goals else []


def benchmark_section(path: Path, images: Path = IMAGES) -> list[str]:
    """One measured file: what it measures, the goal, the numbers with machine and commit, and the plots."""
    data = json.loads(path.read_text())
    lines = [f"## {TITLES.get(path.stem, path.stem.replace('_', ' '))}", ""]
    lines += [f"Data: `benchmarks/measured/{path.name}`.", ""]
    bench = HERE / f"bench_{path.stem}.py"
    if bench.exists():
        lines += [f"Benchmark: `benchmarks/{bench.name}`.", ""]
    for key in DESCRIBE:
        if isinstance(data.get(key), str):
            lines += [f"**{key.capitalize()}**: {data[key]}", ""]
    lines += _goal_lines(data) + _plots(path.stem, images)
    lines += _section(data, 3)
    for key in NOTES:
        if key in data:
            lines += [f"**{key.capitalize()}**:", ""]
            notes = data[key]
            entries = (
                notes.items() if isinstance(notes, dict) else enumerate([notes] if isinstance(notes, str) else notes)
            )
            lines += [f"- {k}: {v}" if isinstance(k, str) else f"- {v}" for k, v in entries] + [""]
    return lines


def goals_section(baseline_path: Path = bench_report.BASELINE) -> list[str]:
    """`make bench`'s goals against the committed baseline run (benchmarks/report.py's table)."""
    baseline = json.loads(baseline_path.read_text())
    lines = ["## `make bench` goals (the committed baseline)", ""]
    lines += [f"Data: `benchmarks/{baseline_path.name}`; goals: `benchmarks/report.py`.", ""]
    lines += _meta_line(baseline)
    rerun = baseline.get("rerun", {})
    if rerun:
        lines += [
            "Benchmarks measured again at a later commit: "
            + ", ".join(f"{k} `{v['commit']}`" for k, v in sorted(rerun.items()))
            + ".",
            "",
        ]
    rows = []
    verdict = {True: "yes", False: "**no**", None: "—"}
    for row in bench_report.rows(baseline.get("results", {})):
        shown = "not reached in the run" if row.unreached else bench_report._number(row.measured, row.unit)
        if row.interval is not None:
            low, high = (bench_report._number(row.interval[0]), bench_report._number(row.interval[1], row.unit))
            shown += f" (95 % interval {low}–{high})"
        rows.append([row.measure, row.goal, shown, verdict[row.passed]])
    return lines + _table(["measure", "goal", "measured", "met"], rows) + [""]


def render_page(measured: Path = MEASURED, images: Path = IMAGES, baseline: Path = bench_report.BASELINE) -> str:
    """The whole page (pure: reads the JSON files and lists the plots, writes nothing)."""
    lines = [
        "# Benchmarks",
        "",
        "<!-- Generated from benchmarks/baseline.json and benchmarks/measured/*.json; do not edit by hand.",
        f"     Regenerate: {COMMAND} -->",
        "",
        "Measured results, each with the machine and the commit it ran on. `make bench` writes a new run's",
        "`results.json` and `report.md` under `runs/bench/<time>/`; a reviewed run becomes the baseline.",
        "",
    ]
    lines += goals_section(baseline)
    for path in sorted(measured.glob("*.json")):
        lines += benchmark_section(path, images)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render docs/benchmarks.md from the measured results.")
    parser.add_argument("--output", type=Path, help="write the page here (default: print it)")
    args = parser.parse_args(argv)
    page = render_page()
    if args.output is None:
        sys.stdout.write(page)
    else:
        args.output.write_text(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
