"""One spelling for every word a figure or a finding is described with.

Severity (what ``levers audit --fail-on`` compares): ``low`` < ``medium`` < ``high``.
Risk (how likely a fix changes results or breaks something): ``low``, ``medium``, ``high``.
Effort: ``S`` (a one-line change), ``M`` (a local rewrite), ``L`` (a design change).

Fix safety: a lever or a fix is ``exact`` (bitwise the same training results, in fp32 on a CPU) or
``changes-numerics`` (results within a stated tolerance). :func:`fix_safety` also reads the
spellings older files carry ("numerics-changing" in ab pre-registrations and records).

How a figure was obtained: ``measured`` (it ran: device time, the allocator, a microbenchmark),
``estimated`` (a model of the GPU: the roofline), ``predicted`` (levers memory's model of the
step), ``counted`` (exact counts: FLOPs, bytes, ops), ``tracked`` (tensor storages followed on a
CPU in place of the allocator), ``unavailable`` (nothing could be said).
"""

from __future__ import annotations

LOW, MEDIUM, HIGH = "low", "medium", "high"
SEVERITIES = (LOW, MEDIUM, HIGH)
RISKS = (LOW, MEDIUM, HIGH)
EFFORTS = ("S", "M", "L")

EXACT = "exact"
CHANGES_NUMERICS = "changes-numerics"
FIX_SAFETIES = (EXACT, CHANGES_NUMERICS)
# older spellings still read from files written before the vocabulary was one
_OLD_FIX_SAFETIES = {"numerics-changing": CHANGES_NUMERICS, "changes numerics": CHANGES_NUMERICS}

MEASURED = "measured"
ESTIMATED = "estimated"
PREDICTED = "predicted"
COUNTED = "counted"
TRACKED = "tracked"
UNAVAILABLE = "unavailable"
PROVENANCES = (MEASURED, ESTIMATED, PREDICTED, COUNTED, TRACKED, UNAVAILABLE)


def fix_safety(value: str) -> str:
    """``value`` in today's spelling (an old file's "numerics-changing" reads as
    "changes-numerics"); a value that is neither fix safety is returned unchanged, for the
    caller's own check to refuse."""
    return _OLD_FIX_SAFETIES.get(value, value)
