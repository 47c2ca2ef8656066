"""docs/levers.md's table of levers agrees with the registry: one row names every registered lever
(and no lever the registry does not hold), and each row's fixes and safety are the lever's own.

The table is written by hand, not generated as docs/rules.md is: its cells say more than a
lever's metadata holds (what it changes on which models, how its tolerance was checked), so this
test holds the facts the registry does hold, and a lever added without a row fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from levers.levers import load_all
from levers.vocab import EXACT

DOCS = Path(__file__).parents[2] / "docs" / "levers.md"
HEADER = "| id | what it does | fixes | safety (checked) |"
CODE = re.compile(r"\b[A-Z]{3,}[0-9]{3}\b")  # ATTN001, not H200
NUMBER = re.compile(r"\b[0-9]+(?:\.[0-9]+)?(?:e-?[0-9]+)?\b")


def _rows() -> list[list[str]]:
    """The table's rows (below its header and rule line), each as its four cells."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    assert HEADER in lines, f"docs/levers.md lost its table header {HEADER!r}"
    rows = []
    for line in lines[lines.index(HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"a row of docs/levers.md without four cells: {line[:80]!r}"
        rows.append(cells)
    return rows


ROWS = _rows()


def _ids(row: list[str]) -> list[str]:
    return re.findall(r"`([a-z0-9-]+)`", row[0])


def test_the_table_names_every_registered_lever_once_and_no_other():
    named = [lever_id for row in ROWS for lever_id in _ids(row)]
    registered = set(load_all())
    assert sorted(set(named) - registered) == [], "docs/levers.md names levers not registered"
    assert sorted(registered - set(named)) == [], "registered levers without a row in the docs"
    assert len(named) == len(set(named)), "a lever with two rows in docs/levers.md"


@pytest.mark.parametrize("row", ROWS, ids=lambda row: ",".join(_ids(row)))
def test_a_row_says_what_its_levers_fix_and_their_safety(row):
    levers = [load_all()[lever_id] for lever_id in _ids(row)]
    assert set(CODE.findall(row[2])) == {code for lever in levers for code in lever.fixes}
    safety = row[3]
    assert safety.startswith("exact") == all(lever.safety == EXACT for lever in levers), safety
    tolerances = {lever.tolerance for lever in levers} - {None}
    if tolerances:
        # the first figure of the cell is the tolerance the lever's parity test checks
        assert {float(NUMBER.search(safety).group())} == tolerances, safety
