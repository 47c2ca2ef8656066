"""What the step already does well, with the evidence, so nobody re-fixes it.

Each rule owns its checks: functions registered with it (``@rule(..., already_right=(...))``,
next to its ``check``) that return the good form of its pattern when the capture shows it. An
item needs positive evidence in the capture, not just a rule that did not fire: SDPA calls that
run a fused backend, norm calls, checkpoint recomputation, a loss with no ignored rows, a peak
metric with a reset. This module only collects them, for the active rules that did not fire,
and adds the one item that belongs to no rule (allocator settings).
"""

from __future__ import annotations

from collections.abc import Iterable

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight
from levers.audit.rules.registry import RightCheck, all_rules

# the order the report lists the rules' items in: attention and norms, memory, the loss, syncs,
# copies, the peak metric, the optimizer, precision; a rule not named here comes after, by code
ORDER = (
    "ATTN001", "ATTN002", "NORM001", "MEM001", "LOSS001", "SYNC001", "COPY001", "MEM002",
    "OPT001", "DTYPE001", "DTYPE003",
)

def expandable_segments(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """The allocator's expandable segments, set in ``PYTORCH_CUDA_ALLOC_CONF``."""
    conf = capture.settings.get("cuda_alloc_conf") or ""
    if "expandable_segments:True" not in conf.replace(" ", ""):
        return None
    return AlreadyRight(
        None, "expandable_segments set", f"PYTORCH_CUDA_ALLOC_CONF={conf}"
    )


def rule_checks() -> list[tuple[str, RightCheck]]:
    """(code, check) of every rule's already-right checks, in the report's order."""
    rules = all_rules()
    codes = [c for c in ORDER if c in rules] + sorted(set(rules) - set(ORDER))
    return [(code, check) for code in codes for check in rules[code].already_right]


def already_right(
    capture: Capture, config: RuleConfig, fired: Iterable[str], active: Iterable[str]
) -> list[AlreadyRight]:
    """Good practice seen in the step, for active rules that did not fire (and rule-free items)."""
    fired, active = set(fired), set(active)
    items = []
    for code, check in rule_checks():
        # the rule fired (its pattern is here), or it was not selected
        if code in fired or code not in active:
            continue
        items.append(check(capture, config))
    items.append(expandable_segments(capture, config))
    return [item for item in items if item is not None]
