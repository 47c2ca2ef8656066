"""The rule registry: each rule registers itself once, by a decorator on its check function.

    @rule("NORM001", "unfused-norm", severity="medium", fix_safety=CHANGES_NUMERICS,
          levers=("rms-norm-fused", "layer-norm-fused"), already_right=(already_right,))
    def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]: ...

The registration carries the rule's metadata, as ruff keeps it on the violation type: its
default severity, its fix safety and the lever ids that fix it, its status (preview, stable,
deprecated, removed), and its already-right checks (``already_right=(...)``): functions of the
capture and config, in the rule's file, that return the good form of its pattern when the step
shows it (an :class:`AlreadyRight`, or None); :mod:`levers.audit.already_right` collects them
for the report when the rule does not fire. A rule builds its findings with
:meth:`Rule.finding`, which fills these in (a finding may still raise or lower the severity
from its numbers, or pick one of the lever ids), so ``levers rule CODE`` and docs/rules.md can
list them without running the rule.

Codes are stable and never reused; a removed rule keeps its code with status "removed".
:func:`all_rules` imports every rule module listed in :data:`RULE_MODULES`, so a rule exists
exactly when its module is listed there and decorated.
"""

from __future__ import annotations

import importlib
import re
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding
from levers.vocab import CHANGES_NUMERICS, FIX_SAFETIES, SEVERITIES

STATUSES = ("preview", "stable", "deprecated", "removed")

RULE_MODULES = (
    "levers.audit.rules.attn001_sdpa_math_fallback",
    "levers.audit.rules.attn002_eager_attention",
    "levers.audit.rules.norm001_unfused_norm",
    "levers.audit.rules.sync001_host_device_sync",
    "levers.audit.rules.copy001_large_copy",
    "levers.audit.rules.copy002_large_upcast",
    "levers.audit.rules.loss001_loss_over_ignored_rows",
    "levers.audit.rules.mem001_activations_without_checkpointing",
    "levers.audit.rules.mem002_lifetime_peak_metric",
    "levers.audit.rules.opt001_unfused_optimizer",
    "levers.audit.rules.dtype001_fp32_matmul",
    "levers.audit.rules.dtype002_fp32_grouped_mm",
    "levers.audit.rules.elem001_memory_bound_elementwise",
    "levers.audit.rules.fuse001_unfused_swiglu",
    "levers.audit.rules.fuse002_unfused_rope",
    "levers.audit.rules.loss002_full_vocab_logits",
    "levers.audit.rules.mem003_unused_gpu_memory",
    "levers.audit.rules.pad001_padding_tokens",
    "levers.audit.rules.dist001_ddp_small_buckets",
    "levers.audit.rules.dist002_find_unused_parameters",
    "levers.audit.rules.dist003_fp32_gradient_allreduce",
    "levers.audit.rules.dist004_unsharded_optimizer_state",
    "levers.audit.rules.mem004_optimizer_state_peak",
    "levers.audit.rules.comp001_graph_breaks_and_recompiles",
    "levers.audit.rules.moe001_experts_loop",
    "levers.audit.rules.host001_launch_gaps",
    "levers.audit.rules.dtype003_bf16_matmul_on_float8_gpu",
)

_CODE = re.compile(r"^[A-Z]+[0-9]{3}$")
_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")

Check = Callable[[Capture, RuleConfig], Iterable[Finding]]
# the good form of a rule's pattern, when the capture shows it
RightCheck = Callable[[Capture, RuleConfig], AlreadyRight | None]

# Rule.finding's "lever not given": the registration's first lever id
_FIRST_LEVER: Any = object()


@dataclass(frozen=True)
class Rule:
    code: str
    name: str
    status: str
    check: Check
    module: str  # the module that defines it, whose docstring documents it
    severity: str  # the default; a finding may move it from its numbers
    fix_safety: str  # vocab.EXACT or vocab.CHANGES_NUMERICS
    levers: tuple[str, ...] = ()  # the lever ids that fix it, the usual one first
    already_right: tuple[RightCheck, ...] = ()  # in the order the report lists them

    @property
    def doc(self) -> str:
        return sys.modules[self.module].__doc__ or ""

    @property
    def summary(self) -> str:
        """The first line of the rule's docstring."""
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    def finding(
        self, *, severity: str | None = None, lever: str | None = _FIRST_LEVER, **fields: Any
    ) -> Finding:
        """A finding of this rule: code, name, fix safety from the registration; ``severity``
        the registered default unless given; ``lever`` the first registered lever unless given
        (one of the registered ids, or None for "no lever here")."""
        if lever is _FIRST_LEVER:
            lever = self.levers[0] if self.levers else None
        if lever is not None and lever not in self.levers:
            raise AssertionError(f"{self.code}: lever {lever!r} not registered ({self.levers})")
        return Finding(
            code=self.code,
            name=self.name,
            severity=severity or self.severity,
            lever=lever,
            fix_safety=self.fix_safety,
            **fields,
        )


_RULES: dict[str, Rule] = {}


def rule(
    code: str,
    name: str,
    *,
    severity: str,
    fix_safety: str,
    levers: tuple[str, ...] = (),
    status: str = "stable",
    already_right: tuple[RightCheck, ...] = (),
) -> Callable[[Check], Check]:
    """Register ``check`` as rule ``code`` (``name`` in kebab case) with its metadata and its
    already-right checks."""
    if not _CODE.match(code):
        raise AssertionError(f"rule code {code!r} must look like ABC123")
    if not _NAME.match(name):
        raise AssertionError(f"rule name {name!r} must be kebab-case")
    if status not in STATUSES:
        raise AssertionError(f"rule status {status!r} not in {STATUSES}")
    if severity not in SEVERITIES:
        raise AssertionError(f"rule severity {severity!r} not in {SEVERITIES}")
    if fix_safety not in FIX_SAFETIES:
        raise AssertionError(f"rule fix safety {fix_safety!r} not in {FIX_SAFETIES}")

    def register(check: Check) -> Check:
        existing = _RULES.get(code)
        if existing is not None and existing.module != check.__module__:
            raise AssertionError(
                f"rule code {code} registered twice ({existing.module})"
            )
        _RULES[code] = Rule(
            code, name, status, check, check.__module__, severity, fix_safety, tuple(levers),
            tuple(already_right),
        )
        return check

    return register


def registered(code: str) -> Rule:
    """The rule registered as ``code`` (its module imported): what a rule's builder reads."""
    return _RULES[code]


def all_rules() -> dict[str, Rule]:
    """Every registered rule by code, in code order."""
    for module in RULE_MODULES:
        importlib.import_module(module)
    return dict(sorted(_RULES.items()))


def _matches(code: str, selectors: Iterable[str]) -> bool:
    # "ATTN" selects ATTN001 and ATTN002, like a linter's prefix selection
    return any(code.startswith(s) for s in selectors)


def select_rules(
    select: Iterable[str] | None = None, ignore: Iterable[str] | None = None
) -> list[Rule]:
    """Active rules: ``select`` (codes or prefixes; all when empty) minus ``ignore``.

    Raises:
        ValueError: a selector that matches no rule code.
    """
    rules = all_rules()
    select = [s.strip().upper() for s in (select or []) if s.strip()]
    ignore = [s.strip().upper() for s in (ignore or []) if s.strip()]
    for selector in select + ignore:
        if not any(code.startswith(selector) for code in rules):
            raise ValueError(
                f"{selector!r} matches no rule code; known codes: {', '.join(rules)}"
            )
    active = [r for r in rules.values() if r.status != "removed"]
    if select:
        active = [r for r in active if _matches(r.code, select)]
    return [r for r in active if not _matches(r.code, ignore)]


def run_rules(
    capture: Capture, config: RuleConfig, rules: Iterable[Rule] | None = None
) -> Iterator[Finding]:
    """Every finding of ``rules`` (default: all active rules) on ``capture``, unpriced."""
    for r in rules if rules is not None else select_rules():
        yield from r.check(capture, config)
