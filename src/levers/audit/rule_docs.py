"""A rule's documentation, from its module docstring and its registration (as ``ruff rule``).

:func:`rule_text` is what ``levers rule CODE`` prints; :func:`rules_markdown` is docs/rules.md:
the general sections of ``rules_intro.md`` (next to this module), a table of every rule with its
metadata, then each rule's docstring with its headings one level down. A test compares the
committed docs/rules.md with :func:`rules_markdown`, so the two cannot drift.
"""

from __future__ import annotations

from importlib import resources

from levers.audit.rules.registry import Rule, all_rules

# the general sections above the table: how findings read, the bottleneck, the ranking
INTRO_RESOURCE = "rules_intro.md"


def _summary(rule: Rule) -> str:
    """The summary line without its "CODE name: " prefix."""
    return rule.summary.split(": ", 1)[1] if ": " in rule.summary else rule.summary


def _body(rule: Rule) -> str:
    """The docstring after its summary line, trimmed."""
    lines = rule.doc.strip().splitlines()[1:]
    return "\n".join(lines).strip()


def metadata_line(rule: Rule) -> str:
    levers = ", ".join(f"`{lever}`" for lever in rule.levers) or "none (a code change)"
    return (
        f"Status: {rule.status} · default severity: {rule.severity} · "
        f"fix safety: {rule.fix_safety} · levers: {levers}"
    )


def rule_text(rule: Rule) -> str:
    """One rule's documentation as ``levers rule CODE`` prints it (Markdown)."""
    return (
        f"# {rule.code} {rule.name}\n\n{_summary(rule)}\n\n{metadata_line(rule)}\n\n"
        f"{_body(rule)}\n"
    )


def _section(rule: Rule) -> str:
    body = "\n".join(
        "#" + line if line.startswith("## ") else line for line in _body(rule).splitlines()
    )
    return f"## {rule.code} {rule.name}\n\n{_summary(rule)}\n\n{metadata_line(rule)}\n\n{body}\n"


def rules_markdown() -> str:
    """docs/rules.md: the intro, the table of rules, and every rule's documentation."""
    intro = resources.files("levers.audit").joinpath(INTRO_RESOURCE).read_text("utf-8")
    rules = all_rules()
    table = [
        "| code | name | status | severity | fix safety | finds |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for code, r in rules.items():
        table.append(
            f"| [{code}](#{code.lower()}-{r.name}) | {r.name} | {r.status} | {r.severity} | "
            f"{r.fix_safety} | {_summary(r)} |"
        )
    sections = "\n".join(_section(r) for r in rules.values())
    return f"{intro.rstrip()}\n\n" + "\n".join(table) + "\n\n" + sections
