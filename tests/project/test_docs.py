"""The README and docs/ describe the product as it is: short status cells, no history, every page indexed,
every relative link resolving, and docs/benchmarks.md rendered from the measured data."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))

import docs_page  # benchmarks/ is a folder of scripts, not a package

README = REPO / "README.md"
DOCS = REPO / "docs"
PRODUCT_DOCS = [README, *sorted(DOCS.glob("*.md"))]  # CHANGELOG.md is history by design
# docs/benchmarks.md renders benchmarks/measured/, where notes about the runs measured belong
PROSE_DOCS = [p for p in PRODUCT_DOCS if p.name != "benchmarks.md"]
MAX_CELL = 200
MAX_LINE = 200

MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
HISTORY = {
    "a date": re.compile(rf"\b\d{{1,2}} ({MONTHS}) \d{{4}}\b|\b({MONTHS}) \d{{4}}\b|\b20\d\d-\d\d(-\d\d)?\b(?!\d)"),
    "an issue number": re.compile(r"\bissues? #?\d+|(?<![\w&/\]])#\d+\b"),
    # "session" alone is a sandbox and HTTP concept here ("an unknown session 404"): only "Session N" counts
    "a numbered run or session": re.compile(r"\b[Rr]un \d+\b|\bSession \d+\b|\b[Aa]ttempt \d+\b"),
    "an account of earlier work": re.compile(
        r"\b(earlier|previous|last) (CI runs?|runs|sessions)\b|\bthe first version\b|\bin this session\b"
        r"|\bWhere the demo stands\b|\bEarlier \(",
        re.IGNORECASE,
    ),
}
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _table_cells(text: str) -> list[str]:
    rows = [line for line in text.splitlines() if line.startswith("|")]
    return [cell.strip() for row in rows for cell in row.strip("|").split("|")]


def test_readme_status_table_cells_are_short() -> None:
    long = [cell[:80] + "..." for cell in _table_cells(README.read_text()) if len(cell) >= MAX_CELL]
    assert not long, f"README.md table cells of {MAX_CELL}+ characters (link to a doc instead): {long}"


def test_readme_lines_are_short() -> None:
    long = [n for n, line in enumerate(README.read_text().splitlines(), 1) if len(line) > MAX_LINE]
    assert not long, f"README.md lines over {MAX_LINE} characters: {long}"


@pytest.mark.parametrize("path", PROSE_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_product_docs_carry_no_history(path: Path) -> None:
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        for kind, pattern in HISTORY.items():
            match = pattern.search(line)
            if match:
                found.append(f"line {number}: {kind}: {match.group(0)!r}")
    assert not found, (
        f"{path.relative_to(REPO)} reads like a run report; describe the product as it is and put measured "
        f"results in benchmarks/measured/ (rendered into docs/benchmarks.md): {found}"
    )


def test_every_doc_is_indexed() -> None:
    index = (DOCS / "README.md").read_text()
    linked = {target.split("#")[0] for target in LINK.findall(index)}
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md" and p.name not in linked]
    assert not missing, f"docs/README.md does not link {missing}: add one line each under its kind"


@pytest.mark.parametrize("path", [*PRODUCT_DOCS, REPO / "CHANGELOG.md"], ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        if not (path.parent / target.split("#")[0]).exists():
            broken.append(target)
    assert not broken, f"{path.relative_to(REPO)} links to files that do not exist: {broken}"


def test_benchmarks_page_is_current() -> None:
    assert (DOCS / "benchmarks.md").read_text() == docs_page.render_page(), (
        f"docs/benchmarks.md is stale: run `{docs_page.COMMAND}`"
    )
