"""Detector rules: pure functions of a Capture that find what a performance review finds.

One rule per file, registered in :mod:`levers.detectors.registry`. :func:`audit` runs the active
rules, prices each finding (:mod:`levers.detectors.cost`), ranks them (:mod:`rank`) and lists
what is already right (:mod:`already_right`).
"""

from levers.detectors.audit import AuditResult, audit
from levers.detectors.finding import Cost, Finding, Receipt

__all__ = ["AuditResult", "Cost", "Finding", "Receipt", "audit"]
