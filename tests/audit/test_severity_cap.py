"""A finding whose priced fix saves nothing is not ranked above low."""

from levers.audit.finding import Cost, Finding, Receipt
from levers.audit.rank import cap_severity


def _finding(severity, now_ms, fixed_ms, saved_bytes=0):
    return Finding(
        code="ELEM001", name="x", message="", fix_title="", receipts=(Receipt("f.py", 1, ""),),
        severity=severity, effort="S", risk="low", lever=None,
        cost=Cost("estimated", now_ms=now_ms, fixed_ms=fixed_ms, saved_bytes=saved_bytes),
    )


def test_no_saving_is_low_a_saving_keeps_its_severity():
    capped = cap_severity(
        [
            _finding("high", 0.5, 0.5),  # saves 0.00 us
            _finding("medium", 0.5, 0.4999999),  # under a thousandth of the 10 ms step
            _finding("high", 0.5, 0.3),  # saves 0.2 ms
            _finding("medium", 0.5, 0.5, saved_bytes=1 << 20),  # frees memory
            _finding("medium", None, None),  # not priced: nothing to say it saves nothing
        ],
        step_ms=10.0,
    )
    assert [f.severity for f in capped] == ["low", "low", "high", "medium", "medium"]
