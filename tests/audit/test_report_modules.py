"""The audit report's modules: records apart from renderers, and no renderer reaching into another.

report.py holds the records, report_format.py the words every renderer shares, and each
render_*.py one form. Imports are read from the source (function-local ones included), and the
plain-text renderers are run in a fresh interpreter to see that no terminal code is loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import levers.audit

AUDIT = Path(levers.audit.__file__).parent
RENDERERS = sorted(p.stem for p in AUDIT.glob("render_*.py"))
# the forms that are plain text or data: they import nothing of the terminal's
PLAIN = ("render_json", "render_markdown", "render_html")
TERMINAL = ("rich", "levers.audit.render_terminal", "levers.audit.render_summary")


def imports_of(module: str) -> set[str]:
    """Every module ``module`` imports, at its top or inside a function."""
    tree = ast.parse((AUDIT / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_the_renderers_are_the_ones_this_test_knows():
    assert RENDERERS == [
        "render_html", "render_json", "render_markdown", "render_summary", "render_terminal",
        "render_trace",
    ]


def test_no_renderer_imports_another_renderer():
    for module in RENDERERS:
        others = {f"levers.audit.{m}" for m in RENDERERS if m != module}
        assert not imports_of(module) & others, module


def test_records_and_shared_words_import_no_renderer_and_no_terminal_code():
    for module in ("report", "report_format", *PLAIN):
        imported = imports_of(module)
        assert not {m for m in imported if m.split(".")[0] == "rich"}, module
        assert not {m for m in imported if m.startswith("levers.audit.render_")}, module


def test_the_plain_renderers_run_without_loading_terminal_code(tmp_path):
    tests = Path(__file__).parents[1]
    script = f"""
import sys
sys.path.insert(0, {str(tests)!r})
from hand_capture import make_capture
from levers.audit import audit
from levers.audit.options import AuditOptions
from levers.audit.report import build_report
from levers.audit.render_html import render_html
from levers.audit.render_json import audit_to_dict
from levers.audit.render_markdown import findings_markdown

capture = make_capture()
result = audit(capture, AuditOptions.checked(gpu="h100", benchmark=False))
report = build_report(capture, result)
markdown = findings_markdown(report)
data = audit_to_dict(report, config=result.config)
page = render_html(capture, report, config=result.config)
assert "### Bottleneck" in markdown and "### Already right" in markdown, markdown
assert data["findings"] and "bottleneck" in data, data
assert "<html" in page
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "rich" or m in {TERMINAL[1:]!r})
print(loaded)
"""
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
