"""Detector rules: pure functions of a Capture that find what a performance review finds.

One rule per file, registered in :mod:`levers.audit.rules.registry`. :func:`audit` runs the active
rules, prices each finding (:mod:`levers.audit.cost`), ranks them (:mod:`rank`) and lists
what is already right (:mod:`already_right`). ``audit(capture, memory=...)`` takes the memory
model's prediction of the step (:func:`predicted_memory_from_plan` of a
``levers.predict_memory`` plan) for MEM001's headroom.
"""

from typing import TYPE_CHECKING

from levers.lazy import lazy_attributes

if TYPE_CHECKING:
    from levers.audit.engine import AuditResult
    from levers.audit.engine import audit
    from levers.audit.config import PredictedMemory
    from levers.audit.config import predicted_memory_from_plan
    from levers.audit.finding import Cost
    from levers.audit.finding import Finding
    from levers.audit.finding import Receipt

# imported on first read (levers.lazy): `levers --help` imports this package without torch
__getattr__, __dir__ = lazy_attributes(
    __name__,
    globals(),
    {
        "AuditResult": "levers.audit.engine",
        "audit": "levers.audit.engine",
        "PredictedMemory": "levers.audit.config",
        "predicted_memory_from_plan": "levers.audit.config",
        "Cost": "levers.audit.finding",
        "Finding": "levers.audit.finding",
        "Receipt": "levers.audit.finding",
    },
)

__all__ = [
    "AuditResult",
    "Cost",
    "Finding",
    "PredictedMemory",
    "Receipt",
    "audit",
    "predicted_memory_from_plan",
]
