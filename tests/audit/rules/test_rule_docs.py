"""Rule metadata on the registration, `levers rule`, and docs/rules.md generated from both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from levers.audit.finding import Receipt
from levers.audit.rule_docs import rule_text, rules_markdown
from levers.audit.rules.registry import all_rules, registered
from levers.cli import main

DOCS = Path(__file__).parents[3] / "docs" / "rules.md"


def _section(doc: str, heading: str) -> str:
    return re.split(r"^## .*$", doc.split(f"## {heading}\n", 1)[1], flags=re.MULTILINE)[0]


def test_docs_rules_md_is_generated():
    assert DOCS.read_text() == rules_markdown(), (
        "docs/rules.md differs from the rules' docstrings: run "
        "`levers rule --all --output docs/rules.md`"
    )


def test_docs_keep_the_general_sections():
    text = rules_markdown()
    assert text.startswith("# Audit rules\n")
    assert "the **bottleneck**" in text and "Findings are ranked by payoff" in text


@pytest.mark.parametrize("code", sorted(all_rules()))
def test_fix_names_the_registered_levers_and_safety(code):
    r = all_rules()[code]
    fix = _section(r.doc, "Fix")
    for lever in r.levers:
        assert f"`{lever}`" in fix or f"lever {lever}" in fix, f"{code}: Fix omits {lever}"
    safety = _section(r.doc, "Fix safety").strip().lower()
    assert safety.startswith(r.fix_safety.replace("-", " ")), f"{code}: Fix safety says {safety[:30]!r}"


def test_the_docs_name_the_tune_command_the_audit_of_a_script_prints():
    from levers.audit.recommend import tune_takes_scripts

    text = " ".join(rules_markdown().split())
    # the audit of a script prints `levers tune -- python ...` as a next step (levers.audit.
    # recommend.without_spec_steps); the docs said that verb would take a script one day
    assert tune_takes_scripts()
    assert "once that verb takes a script" not in text
    script = text.split("A script audited after `--`", 1)[1].split("The report ends with", 1)[0]
    assert "the `levers tune -- python train.py` command" in script


def test_rule_prints_its_documentation(capsys):
    assert main(["rule", "attn001"]) == 0
    out = capsys.readouterr().out
    assert out == rule_text(all_rules()["ATTN001"])
    assert out.startswith(
        "# ATTN001 sdpa-math-fallback\n\nan SDPA call runs the MATH backend, or a slower one "
        "than it could.\n\nStatus: stable · default severity: high · fix safety: "
        "changes-numerics · levers: `sdpa-cudnn-backend`\n\n## What it does\n"
    )


def test_rule_all_writes_the_docs(tmp_path, capsys):
    target = tmp_path / "rules.md"
    assert main(["rule", "--all", "--output", str(target)]) == 0
    assert target.read_text() == rules_markdown()
    assert main(["rule", "--all"]) == 0
    assert capsys.readouterr().out == rules_markdown()


def test_rule_refuses_unknown_code_and_bad_arguments(capsys):
    assert main(["rule", "NOPE001"]) == 2
    assert "no rule 'NOPE001'; known codes: ATTN001" in capsys.readouterr().err
    assert main(["rule"]) == 2
    assert main(["rule", "ATTN001", "--all"]) == 2


def test_finding_starts_from_the_registration():
    receipt = Receipt(file="train.py", line=3, code="x = 1")
    norm = registered("NORM001")
    plain = norm.finding(message="m", fix_title="f", receipts=(receipt,), effort="S", risk="low")
    assert (plain.code, plain.name, plain.severity, plain.fix_safety, plain.lever) == (
        "NORM001", "unfused-norm", "medium", "changes-numerics", "rms-norm-fused",
    )
    raised = norm.finding(
        message="m", fix_title="f", receipts=(receipt,), effort="S", risk="low",
        severity="high", lever="layer-norm-fused",
    )
    assert (raised.severity, raised.lever) == ("high", "layer-norm-fused")
    with pytest.raises(AssertionError, match="not registered"):
        norm.finding(
            message="m", fix_title="f", receipts=(receipt,), effort="S", risk="low",
            lever="autocast-bf16",
        )
