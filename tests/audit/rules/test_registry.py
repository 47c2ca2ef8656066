"""The rule registry: the frozen list of codes, each rule's docstring sections, selection."""

from __future__ import annotations

import re

import pytest

from levers.audit.rules.registry import STATUSES, all_rules, rule, select_rules

# Codes are never reused or renamed: a change here is a deliberate, reviewed act.
FROZEN = {
    "ATTN001": "sdpa-math-fallback",
    "ATTN002": "eager-attention",
    "COPY001": "large-copy",
    "COPY002": "large-upcast",
    "DIST001": "ddp-small-buckets",
    "DIST002": "find-unused-parameters",
    "DIST003": "fp32-gradient-allreduce",
    "DIST004": "unsharded-optimizer-state",
    "DTYPE001": "fp32-matmul",
    "DTYPE002": "fp32-grouped-mm",
    "LOSS001": "loss-over-ignored-rows",
    "MEM001": "activations-without-checkpointing",
    "MEM002": "lifetime-peak-metric",
    "NORM001": "unfused-norm",
    "OPT001": "unfused-optimizer",
    "SYNC001": "host-device-sync",
    "ELEM001": "memory-bound-elementwise",
    "FUSE001": "unfused-swiglu",
    "FUSE002": "unfused-rope",
    "LOSS002": "full-vocab-logits",
    "MEM003": "unused-gpu-memory",
    "PAD001": "padding-tokens",
    "COMP001": "graph-breaks-and-recompiles",
    "MEM004": "optimizer-state-peak",
    "MOE001": "experts-loop",
    "HOST001": "launch-gaps",
    "DTYPE003": "bf16-matmul-on-float8-gpu",
}
SECTIONS = (
    "## What it does",
    "## Why is this bad?",
    "## Example",
    "## Fix",
    "## Fix safety",
    "## Known problems",
    "## References",
)


def test_codes_are_frozen():
    assert {code: r.name for code, r in all_rules().items()} == FROZEN


@pytest.mark.parametrize("code", sorted(FROZEN))
def test_docstring_sections(code):
    r = all_rules()[code]
    doc = r.doc
    assert r.summary.startswith(f"{code} {r.name}: "), r.summary
    headings = [line.strip() for line in doc.splitlines() if line.startswith("## ")]
    assert tuple(headings) == SECTIONS, f"{code} headings {headings}"
    sections = re.split(r"^## .*$", doc, flags=re.MULTILINE)[1:]
    for heading, body in zip(SECTIONS, sections):
        assert body.strip(), f"{code}: section {heading!r} is empty"
    example = sections[SECTIONS.index("## Example")]
    assert "Use instead:" in example and example.count("```python") == 2, (
        f"{code}: Example needs code and Use instead:"
    )
    assert (
        "http" in sections[SECTIONS.index("## References")]
        or "pytorch" in sections[-1].lower()
    )
    assert r.status in STATUSES


def test_a_code_cannot_be_registered_twice():
    with pytest.raises(AssertionError, match="registered twice"):
        rule("ATTN001", "other-name", severity="low", fix_safety="exact")(
            lambda capture, config: []
        )


def test_bad_code_and_name_refused():
    with pytest.raises(AssertionError):
        rule("attn1", "x", severity="low", fix_safety="exact")
    with pytest.raises(AssertionError):
        rule("ABC123", "Not_Kebab", severity="low", fix_safety="exact")
    with pytest.raises(AssertionError, match="severity"):
        rule("ABC123", "ok-name", severity="med", fix_safety="exact")
    with pytest.raises(AssertionError, match="fix safety"):
        rule("ABC123", "ok-name", severity="low", fix_safety="maybe")


def test_select_and_ignore_by_code_and_prefix():
    assert [r.code for r in select_rules(["ATTN"], None)] == ["ATTN001", "ATTN002"]
    assert [r.code for r in select_rules(["ATTN", "MEM002"], ["ATTN002"])] == [
        "ATTN001",
        "MEM002",
    ]
    assert "SYNC001" not in [r.code for r in select_rules(None, ["sync"])]
    with pytest.raises(ValueError, match="matches no rule code"):
        select_rules(["NOPE"], None)


def test_docs_rules_md_documents_every_rule():
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "rules.md").read_text()
    for code, r in all_rules().items():
        assert f"\n## {code} {r.name}\n" in text, f"docs/rules.md lacks {code}"
        assert f"| [{code}](#{code.lower()}-{r.name}) | {r.name} | {r.status} |" in text
