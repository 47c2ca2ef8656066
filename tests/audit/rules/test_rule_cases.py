"""Every rule's fixture cases: fire_* fire on their marked line, ok_* do not fire, and the
printed findings of all cases match the rule's golden file."""

from __future__ import annotations

import pytest
from audit_helpers import HERE, case_names, check_golden, mark_line, run_rule

from levers.audit.rules.registry import all_rules

CODES = sorted(all_rules())
CASES = [(code, name) for code in CODES for name in case_names(code)]


def test_every_rule_has_fire_ok_and_golden():
    for code in CODES:
        names = case_names(code)
        assert any(n.startswith("fire_") for n in names), f"{code} has no fire_ case"
        assert any(n.startswith("ok_") for n in names), f"{code} has no ok_ case"
        assert (HERE / code / "golden.txt").exists(), f"{code} has no golden.txt"


@pytest.mark.parametrize("code,name", [c for c in CASES if c[1].startswith("fire_")])
def test_fire_cases_fire_on_the_marked_line(code, name):
    findings = run_rule(code, name)
    assert findings, f"{code} did not fire on {name}"
    line = mark_line(code, name)
    lines = {
        (r.file.endswith("cases.py"), r.line) for f in findings for r in f.receipts
    }
    assert (True, line) in lines, (
        f"{code} on {name}: receipts {lines}, expected cases.py:{line}"
    )
    assert all(f.code == code for f in findings)


@pytest.mark.parametrize("code,name", [c for c in CASES if c[1].startswith("ok_")])
def test_ok_cases_do_not_fire(code, name):
    assert run_rule(code, name) == []


@pytest.mark.parametrize("code", CODES)
def test_golden(code):
    check_golden(code)
