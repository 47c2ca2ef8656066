"""One vocabulary: the words of levers.vocab are spelled nowhere else in src/levers as literals."""

from __future__ import annotations

import re
from pathlib import Path

import levers
from levers import vocab

ROOT = Path(levers.__file__).parent
# the spellings one concept had before it had one: only vocab.py may still know them
RETIRED = ('"numerics-changing"', '"changes numerics"', '"med"')


def test_retired_spellings_appear_only_in_vocab():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "vocab.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            found += [f"{path.relative_to(ROOT)}:{number}" for w in RETIRED if w in code]
    assert found == []


def test_fix_safety_reads_old_spellings():
    assert vocab.fix_safety("numerics-changing") == vocab.CHANGES_NUMERICS
    assert vocab.fix_safety("changes numerics") == vocab.CHANGES_NUMERICS
    assert vocab.fix_safety("exact") == vocab.EXACT
    assert vocab.fix_safety("mostly") == "mostly"  # left for the caller's check to refuse


def test_one_scale_for_severity_and_risk():
    assert vocab.SEVERITIES == vocab.RISKS == ("low", "medium", "high")
    assert vocab.EFFORTS == ("S", "M", "L")
    assert set(vocab.PROVENANCES) >= {"measured", "estimated", "predicted"}
    assert all(re.fullmatch(r"[a-z-]+", word) for word in vocab.FIX_SAFETIES)
