"""Findings: what a detector rule reports, as plain frozen records (and what it saw done right).

A rule fills in what it saw (code, message, fix, receipts, effort, risk, severity) and the
*work* the pattern costs and would cost fixed (FLOPs, bytes, kernels per step). The cost model
(:mod:`levers.audit.cost`) turns that work into a :class:`Cost`, estimated for a target GPU
from a CPU capture or measured on a GPU, and returns the finding with ``cost`` set.

Legend:
    severity, effort, risk, fix safety and provenance: the words of :mod:`levers.vocab`
    (severity "low" < "medium" < "high", what ``--fail-on`` compares; a cost "measured" on a
    GPU, "estimated" by a roofline on the target GPU's ceilings, or "unavailable").
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from levers.vocab import EFFORTS, FIX_SAFETIES, RISKS, SEVERITIES


@dataclass(frozen=True)
class Receipt:
    """Where in the user's code a finding is, and what ran there."""

    file: str
    line: int
    code: str  # the stripped text of that line
    module: str | None = (
        None  # "vision.blocks.*.attn" (numbered children collapsed), or None
    )
    op: str = (
        ""  # the op or call that shows the pattern: "aten.bmm", "Tensor.__bool__", ...
    )
    shapes: str = ""  # e.g. "[2, 4, 16, 16] float32"
    count: int = 1  # times per step
    end_line: int | None = (
        None  # the last line of a multi-line pattern in the same file
    )

    @property
    def location(self) -> str:
        if self.end_line is not None and self.end_line != self.line:
            return f"{self.file}:{self.line}-{self.end_line}"
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Part:
    """One group of kernels: the unit the roofline prices.

    ``dtype`` is the compute dtype of ``flops`` ("bfloat16", "float32", ...; "" when there are
    no FLOPs); ``tf32`` says whether fp32 matmuls may use TF32 tensor cores.
    """

    label: str
    flops: int = 0
    bytes: int = 0
    num_kernels: int = 1
    dtype: str = ""
    tf32: bool = False


@dataclass(frozen=True)
class Work:
    """The work of a pattern per step, now and with the fix, for the cost model.

    ``now_ops`` are the capture's op indices that the pattern ran (forward and backward), so a
    GPU capture can sum their measured device time. ``bench`` asks for a microbenchmark of the
    fix at the shapes seen (see :mod:`levers.audit.cost.measure`); None when the fix simply
    removes the work or no benchmark exists.
    """

    now: tuple[Part, ...] = ()
    fixed: tuple[Part, ...] = ()
    now_ops: tuple[int, ...] = ()
    calls_per_step: int = 1
    bench: dict[str, Any] | None = None
    saved_bytes: int = 0  # memory the fix frees at the peak (0 when it frees none)
    # a fixed time that is a fraction of the measured "now" (e.g. only the valid rows remain)
    fixed_fraction_of_now: float | None = None
    # why that fraction, in words for the cost's basis ("" reads as "the rows that remain")
    fixed_fraction_why: str = ""
    # ops the fixed version runs again on top of the fixed parts (recomputation)
    fixed_extra_ops: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cost:
    """What a finding costs per step and what it would cost fixed."""

    provenance: str  # "measured", "estimated", "unavailable"
    now_ms: float | None
    fixed_ms: float | None
    saved_bytes: int = 0
    basis: str = ""  # how the figures were obtained, in words
    per_call_now_ms: float | None = None
    per_call_fixed_ms: float | None = None
    calls_per_step: int = 1
    fixed_provenance: str | None = (
        None  # when "fixed" was obtained differently from "now"
    )

    @property
    def saved_ms(self) -> float:
        if self.now_ms is None or self.fixed_ms is None:
            return 0.0
        return max(self.now_ms - self.fixed_ms, 0.0)


@dataclass(frozen=True)
class Finding:
    """One instance of a rule's pattern in a step."""

    code: str
    name: str
    message: str  # what is wrong, here
    fix_title: str  # what to do
    receipts: tuple[Receipt, ...]
    severity: str
    effort: str
    risk: str
    lever: str | None = None  # a lever id; levers are not implemented yet
    fix_safety: str = ""  # vocab.EXACT or vocab.CHANGES_NUMERICS
    work: Work = field(default_factory=Work)
    cost: Cost | None = None
    details: dict[str, Any] = field(
        default_factory=dict
    )  # rule-specific facts, for --json

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise AssertionError(f"severity {self.severity!r} not in {SEVERITIES}")
        if self.effort not in EFFORTS:
            raise AssertionError(f"effort {self.effort!r} not in {EFFORTS}")
        if self.risk not in RISKS:
            raise AssertionError(f"risk {self.risk!r} not in {RISKS}")
        if self.fix_safety and self.fix_safety not in FIX_SAFETIES:
            raise AssertionError(f"fix safety {self.fix_safety!r} not in {FIX_SAFETIES}")
        if not self.receipts:
            raise AssertionError(f"{self.code} finding without a receipt")

    @property
    def receipt(self) -> Receipt:
        return self.receipts[0]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["cost"] = (
            None
            if self.cost is None
            else {**asdict(self.cost), "saved_ms": self.cost.saved_ms}
        )
        return data


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True)
class AlreadyRight:
    """Good practice seen in a step, with the evidence, so nobody re-fixes it."""

    code: str | None  # the rule whose pattern this is the fixed form of (None: no rule)
    title: str
    detail: str
