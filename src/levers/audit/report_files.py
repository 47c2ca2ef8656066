"""The audit's files for a run directory: audit.md, audit.html, capture.json and trace.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from levers.audit.render_html import write_html
from levers.audit.render_json import audit_to_dict
from levers.audit.render_markdown import findings_markdown
from levers.audit.render_trace import write_trace
from levers.capture.json_io import write_capture
from levers.output.atomic import atomic_write_text

REPORT_FILES = ("audit.md", "audit.html", "capture.json", "trace.json")


def write_reports(audited: Any, directory: Path) -> dict[str, Path]:
    """Write an :class:`levers.audit.run.AuditedStep`'s files into ``directory`` (created if
    needed), each atomically; returns name -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {name: directory / name for name in REPORT_FILES}
    config = audited.result.config
    atomic_write_text(paths["audit.md"], findings_markdown(audited.report))
    write_html(
        audited.capture, audited.report, paths["audit.html"], config=config,
        memory=audited.memory,
    )
    write_capture(
        audited.capture,
        paths["capture.json"],
        extra={"audit": audit_to_dict(audited.report, config=config)},
    )
    write_trace(audited.capture, paths["trace.json"])
    return paths
