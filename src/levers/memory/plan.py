"""The records of a memory prediction: :class:`MemoryPlan` and what it is made of.

Every byte count is a caching-allocator block size (what ``memory_allocated`` counts), not the
bytes a tensor asked for, so the categories at the peak add up to the allocated peak.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from levers.hardware import GpuSpec


@dataclass(frozen=True)
class CategoryBytes:
    category: str
    nbytes: int


@dataclass(frozen=True)
class ModuleBytes:
    module: str  # a block path ("blocks.3"), or "(outside modules) file.py:LINE"
    nbytes: int


@dataclass(frozen=True)
class LiveTensor:
    """One of the largest allocations live at the peak."""

    category: str
    module: str | None
    op: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    phase: str
    step: int
    source: str | None


@dataclass(frozen=True)
class PeakMoment:
    """The allocation that set the allocated peak."""

    phase: str
    step: int
    module: str | None
    op: str
    source: str | None
    event_index: int


@dataclass(frozen=True)
class TimelinePoint:
    event_index: int
    phase: str
    step: int
    allocated_bytes: int
    reserved_bytes: int
    op: str  # the allocation at this point ("" for a free)
    module: str | None
    delta_bytes: int  # + allocated, - freed (requested bytes)


@dataclass(frozen=True)
class BackendCount:
    backend: str
    num_calls: int  # per step
    example: str  # shapes of one call, "q [B,H,L,E] k [...]"
    rejected: tuple[str, ...]


@dataclass(frozen=True)
class WhatIf:
    """A predicted change without touching the code."""

    name: str  # "activation-checkpointing", "bf16-optimizer-states", "valid-rows-loss"
    description: str
    method: str  # how it was predicted
    applicable: bool
    peak_allocated_bytes: int = 0
    peak_reserved_bytes: int = 0
    delta_allocated_bytes: int = 0
    delta_reserved_bytes: int = 0
    note: str = ""
    lever: str = ""  # the lever that makes this change, where one does ("adamw-bf16-state")
    delta_state_bytes: int = 0  # the optimizer state's change, for what-ifs on the state


@dataclass(frozen=True)
class FitPoint:
    value: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    fits: bool


@dataclass(frozen=True)
class FitResult:
    """The largest value of an integer parameter whose reserved peak fits the budget."""

    param: str
    best: int | None  # None when even the smallest value tried does not fit
    budget_bytes: int  # usable GPU memory times (1 - margin)
    margin: float
    curve: tuple[FitPoint, ...]  # every value evaluated, in the order tried
    # "" (the next value up was predicted not to fit), "cap" (the cap fits: the largest is at
    # least best) or "evaluations" (the predictions allowed ran out first)
    stopped: str = ""
    upper: int | None = None  # the cap of the search, when it had one
    not_fitting: int | None = None  # the smallest value predicted not to fit, when one was

    @property
    def exact(self) -> bool:
        """The search closed: ``best`` fits and ``best + 1`` does not."""
        return not self.stopped

    def statement(self) -> str:
        """The largest that fits, as a reader must take it ("at least N" when it stopped)."""
        if self.best is None:
            return "none (even the smallest value tried is over)"
        if self.stopped == "cap":
            return f"at least {self.best} (the search stopped at its cap, {self.upper})"
        if self.stopped:
            above = f"; {self.not_fitting} does not" if self.not_fitting is not None else ""
            return (
                f"at least {self.best} (the search stopped after {len(self.curve)} "
                f"predictions{above})"
            )
        if self.not_fitting is not None and self.not_fitting > self.best + 1:
            return f"{self.best} ({self.not_fitting} does not fit; the search closes within 0.1%)"
        return str(self.best)


@dataclass(frozen=True)
class Measured:
    """Peaks of the real step on a GPU."""

    device_name: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    num_steps: int
    torch_version: str


@dataclass(frozen=True)
class MemoryPlan:
    """A predicted training-step memory plan for one workload on one GPU."""

    workload: str
    params: dict[str, Any]
    gpu: GpuSpec
    num_steps: int  # steps replayed after the build; peaks are over the whole run
    peak_allocated_bytes: int  # predicted max_memory_allocated
    peak_reserved_bytes: int  # predicted max_memory_reserved
    usable_bytes: int  # what the allocator can reserve on the GPU
    margin: float
    fits: bool  # peak_reserved <= usable * (1 - margin)
    num_parameters: int
    by_category: tuple[CategoryBytes, ...]  # at the allocated peak, largest first
    activations_by_module: tuple[ModuleBytes, ...]
    peak: PeakMoment
    live_at_peak: tuple[LiveTensor, ...]
    timeline: tuple[TimelinePoint, ...]
    around_peak: tuple[TimelinePoint, ...]
    attention: tuple[BackendCount, ...]
    assumptions: tuple[str, ...]
    whatifs: tuple[WhatIf, ...] = ()
    fit: FitResult | None = None
    measured: Measured | None = None
    seconds: float = 0.0  # wall time of the prediction
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def headroom_bytes(self) -> int:
        """Usable memory left at the reserved peak (negative when it does not fit)."""
        return self.usable_bytes - self.peak_reserved_bytes

    def to_dict(self) -> dict[str, Any]:
        """Plain data for JSON."""
        data = asdict(self)
        data["gpu"]["usable_bytes"] = self.gpu.usable_bytes
        data["headroom_bytes"] = self.headroom_bytes
        return data
