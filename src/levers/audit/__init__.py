"""Detector rules: pure functions of a Capture that find what a performance review finds.

One rule per file, registered in :mod:`levers.audit.rules.registry`. :func:`audit` runs the active
rules, prices each finding (:mod:`levers.audit.cost`), ranks them (:mod:`rank`) and lists
what is already right (:mod:`already_right`). ``audit(capture, memory=...)`` takes the memory
model's prediction of the step (:func:`predicted_memory_from_plan` of a
``levers.predict_memory`` plan) for MEM001's headroom.
"""

from levers.audit.engine import AuditResult, audit
from levers.audit.config import PredictedMemory, predicted_memory_from_plan
from levers.audit.finding import Cost, Finding, Receipt

__all__ = [
    "AuditResult",
    "Cost",
    "Finding",
    "PredictedMemory",
    "Receipt",
    "audit",
    "predicted_memory_from_plan",
]
