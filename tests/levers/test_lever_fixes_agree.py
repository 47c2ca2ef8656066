"""One source of truth for the codes a lever fixes: the lever's own ``fixes``. The rules that
name a lever in their registration (what the audit prints beside a finding) agree with it, so
``levers list`` and the audit say the same."""

from levers.audit.rules.registry import all_rules
from levers.levers import load_all


def test_every_rule_naming_a_lever_is_among_the_codes_the_lever_declares():
    levers = load_all()
    wrong = [
        (rule.code, lever_id, levers[lever_id].fixes)
        for rule in all_rules().values()
        for lever_id in rule.levers
        if lever_id in levers and rule.code not in levers[lever_id].fixes
    ]
    assert wrong == []


def test_every_code_a_lever_declares_names_the_lever_in_its_rule():
    rules = all_rules()
    wrong = [
        (lever.id, code, rules[code].levers if code in rules else None)
        for lever in load_all().values()
        for code in lever.fixes
        if code not in rules or lever.id not in rules[code].levers
    ]
    assert wrong == []


def test_the_three_levers_the_issue_named():
    levers = load_all()
    assert levers["raise-batch"].fixes == ("MEM003",)
    assert {"ELEM001", "FUSE001", "FUSE002", "NORM001"} <= set(levers["compile-blocks"].fixes)
    assert {"ELEM001", "FUSE001", "FUSE002", "NORM001"} <= set(levers["liger-kernels"].fixes)
