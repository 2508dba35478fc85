"""docs/development.md lists every lab scenario and where it lives: each test function of
tests/integration, and none that is gone."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "development.md"


def lab_tests() -> set[tuple[str, str]]:
    found = set()
    for path in sorted((REPO / "tests" / "integration").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found.add((path.name, node.name))
    return found


def listed() -> set[tuple[str, str]]:
    """(module, test) of each row of the doc's table; a row with no module is the last one's."""
    text = DOC.read_text().split("### Every lab scenario, and where it lives", 1)[1]
    rows, module = set(), ""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith(
            "|") else []
        if len(cells) < 3 or not cells[1].startswith("`test"):
            continue
        module = cells[0].strip("`") or module
        rows.add((module, cells[1].strip("`")))
    return rows


def test_every_lab_test_is_in_the_table_and_every_row_is_a_test() -> None:
    have, doc = lab_tests(), listed()
    assert len(have) > 50, have  # the parse found the suite
    assert not have - doc, f"in tests/integration, not in {DOC.name}: {sorted(have - doc)}"
    assert not doc - have, f"in {DOC.name}, not in tests/integration: {sorted(doc - have)}"


def test_the_table_parse_sees_a_row_per_module() -> None:
    modules = {m for m, _ in listed()}
    assert modules == {p for p, _ in lab_tests()}
    assert all(re.fullmatch(r"test_\w+\.py", m) for m in modules)
