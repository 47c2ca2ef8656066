"""The allocation trace of a step run on fake tensors: what was allocated on the (stand-in) GPU,
where, and when it was freed. The allocator model replays it; attribution reads it.

Legend:
    category: "parameters", "buffers", "inputs" (tensors the factory made that are neither,
        e.g. fixed batch layouts), "activations" (allocated in forward and still alive when
        backward starts: what the step keeps for backward, and its outputs), "gradients"
        (a parameter's ``.grad``), "optimizer" (optimizer state), "temporaries" (everything
        freed before it could be one of those), "workspace" (kernel buffers, see
        :mod:`levers.memory.kernels`).
    phase: "build" (the factory), "forward", "backward", "optimizer" (``optimizer.step``),
        "other" (between backward and the optimizer, and after it).
    events: ``+n`` allocates ``allocations[n - 1]``, ``-n`` frees it.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.memory.sdpa import SdpaCall

CATEGORIES = (
    "parameters",
    "buffers",
    "inputs",
    "activations",
    "gradients",
    "optimizer",
    "temporaries",
    "workspace",
)
PHASES = ("build", "forward", "backward", "optimizer", "other")


@dataclass(frozen=True)
class Allocation:
    """One storage that the step allocated on the GPU."""

    nbytes: int
    category: str
    phase: str
    step: int  # -1 for the factory
    module: str | None  # module path ("" is the model itself); None outside any module
    op: str  # "aten.mm.default", or a workspace label
    shape: tuple[int, ...]
    dtype: str
    recompute: bool = False  # made by activation-checkpoint recomputation
    source: str | None = None  # "file.py:LINE" of the step code, for allocations outside modules
    state_derived: bool = False  # optimizer-phase temporary computed from optimizer state
    call: int = -1  # the aten call that made it, counted over the run (outputs of one call share it)
    flops: int = 0  # that call's FLOPs (torch.utils.flop_counter's formulas; 0 where none)


@dataclass(frozen=True)
class LossCall:
    """A cross-entropy call: how many rows it scored and how many had a real target."""

    num_rows: int
    num_classes: int
    num_valid_rows: int | None  # None where the targets' values were not known


@dataclass(frozen=True)
class Trace:
    allocations: tuple[Allocation, ...]
    events: tuple[int, ...]
    backward_starts: tuple[int, ...]  # for each step, the index of its first backward event
    num_steps: int
    sdpa_calls: tuple[SdpaCall, ...]
    losses: tuple[LossCall, ...]
    assumptions: tuple[str, ...]
    num_parameters: int
    # the graphs torch.compile compiled for the step's compiled modules (compile-blocks), in
    # order (levers.memory.compiled.CompiledGraph); empty when nothing was compiled
    compiled_graphs: tuple = ()
