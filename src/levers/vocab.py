"""One spelling for every word a figure or a finding is described with.

Fix safety: a lever or a fix is ``exact`` (bitwise the same training results, in fp32 on a CPU) or
``changes-numerics`` (results within a stated tolerance).
"""

from __future__ import annotations

EXACT = "exact"
CHANGES_NUMERICS = "changes-numerics"
FIX_SAFETIES = (EXACT, CHANGES_NUMERICS)
