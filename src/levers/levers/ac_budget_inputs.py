"""What ``ac-budget`` chooses from: one block's ops with the bytes each would keep and the time
each would cost to recompute, and the step's memory outside the blocks.

- Bytes come from levers memory's prediction (the stand-in tracker's trace of a step on fake
  tensors): the allocations one block's forward makes, grouped by the aten call that made them.
- Times come from a capture of the step when one is given (GPU device time, ``measured``), or
  are estimated from each call's FLOPs and bytes against the target GPU's ceilings
  (``estimated``).

An op is keyed by its name and occurrence in the block (see :mod:`levers.levers.sac`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from levers.blocks import Block, repeated_blocks
from levers.hardware import resolve_gpu
from levers.levers.sac import key_name
from levers.vocab import ESTIMATED, MEASURED

# roofline of the estimate: the audit cost model's efficiencies (levers/audit/cost/roofline.py)
_MATMUL_EFFICIENCY = 0.7
_BANDWIDTH_EFFICIENCY = 0.8
_KERNEL_OVERHEAD_US = 2.0


@dataclass(frozen=True)
class OpCost:
    name: str  # key_name of the aten op
    occurrence: int  # among the block's calls of that name, from 0
    saved_bytes: int  # what keeping its outputs holds
    time_us: float  # what recomputing it costs
    flops: int

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.occurrence)


@dataclass(frozen=True)
class BudgetInputs:
    """One block's ops and the step's memory, as ``ac-budget`` sees them."""

    ops: tuple[OpCost, ...]  # one block's forward, in order (its output op excluded)
    container: str  # the module path of the blocks described ("model.layers")
    num_blocks: int
    block_activation_bytes: int  # what one block keeps for backward without checkpointing
    block_output_bytes: int  # what a checkpointed block still keeps: its output, the next input
    peak_bytes: int  # the step's peak without checkpointing
    time_source: str  # "measured" (a GPU capture) or "estimated"

    @property
    def fixed_bytes(self) -> int:
        """The peak without the blocks' activations: parameters, optimizer, logits, ..."""
        return self.peak_bytes - self.num_blocks * self.block_activation_bytes

    @property
    def activation_bytes(self) -> int:
        return self.num_blocks * self.block_activation_bytes


def _estimate_us(flops: int, moved_bytes: int, dtype: str, gpu: Any) -> float:
    compute_s = flops / (gpu.peak_flops(dtype) * _MATMUL_EFFICIENCY) if flops else 0.0
    memory_s = moved_bytes / (gpu.bandwidth_bytes_per_s * _BANDWIDTH_EFFICIENCY)
    return max(compute_s, memory_s) * 1e6 + _KERNEL_OVERHEAD_US


def _block_calls(trace: Any, path: str) -> list[list[Any]]:
    """The allocations of block ``path``'s forward in the last step, grouped by aten call."""
    step = trace.num_steps - 1
    calls: dict[int, list[Any]] = defaultdict(list)
    for allocation in trace.allocations:
        module = allocation.module or ""
        if allocation.step != step or allocation.phase != "forward":
            continue
        if allocation.category == "workspace":
            continue
        if module == path or module.startswith(path + "."):
            calls[allocation.call].append(allocation)
    return [calls[c] for c in sorted(calls)]


def _activation_bytes(calls: list[list[Any]]) -> int:
    return sum(a.nbytes for group in calls for a in group if a.category == "activations")


def from_prediction(
    prediction: Any, blocks: list[Block], capture: Any = None, gpu: str = "h200"
) -> BudgetInputs:
    """Budget inputs from a :class:`levers.memory.predict.Prediction` of the step without
    checkpointing, the model's repeated blocks (paths) and, optionally, a capture for times.

    Where a model has several block containers (a vision tower's and a decoder's), the one whose
    blocks keep the most activations is described."""
    if not blocks:
        raise ValueError("ac-budget needs a model with repeated blocks; this one has none")
    trace = prediction.trace
    by_container: dict[str, list[Block]] = defaultdict(list)
    for block in blocks:
        by_container[block.container].append(block)
    firsts = {c: _block_calls(trace, members[0].path) for c, members in by_container.items()}
    container = max(
        by_container, key=lambda c: _activation_bytes(firsts[c]) * len(by_container[c])
    )
    first = by_container[container][0].path
    ordered = firsts[container]
    if not ordered:
        raise ValueError(f"the prediction holds no forward allocations of block {first}")
    activation_bytes = _activation_bytes(ordered)
    *body, output = ordered
    times = _capture_times(capture, first) if capture is not None else None
    spec = resolve_gpu(gpu)
    counts: dict[str, int] = defaultdict(int)
    ops = []
    for group in body:
        name = key_name(group[0].op)
        occurrence = counts[name]
        counts[name] += 1
        nbytes = sum(a.nbytes for a in group)
        flops = sum(a.flops for a in group)
        if times is not None:
            time_us = times.get((name, occurrence), 0.0)
        else:
            # an elementwise op reads about what it writes
            time_us = _estimate_us(flops, 2 * nbytes, group[0].dtype, spec)
        ops.append(OpCost(name, occurrence, nbytes, time_us, flops))
    return BudgetInputs(
        ops=tuple(ops),
        container=container,
        num_blocks=len(by_container[container]),
        block_activation_bytes=activation_bytes,
        block_output_bytes=sum(a.nbytes for a in output),
        peak_bytes=prediction.replay.peak_allocated_bytes,
        time_source=ESTIMATED if times is None else MEASURED,
    )


def with_capture_times(inputs: BudgetInputs, capture: Any, block: str) -> BudgetInputs:
    """``inputs`` with each op's time taken from ``capture`` (block ``block``'s forward)."""
    times = _capture_times(capture, block)
    ops = tuple(replace(op, time_us=times.get(op.key, 0.0)) for op in inputs.ops)
    return replace(inputs, ops=ops, time_source=MEASURED)


def _capture_times(capture: Any, block: str) -> dict[tuple[str, int], float]:
    """Device time per (name, occurrence) of the block's forward ops that write memory."""
    counts: dict[str, int] = defaultdict(int)
    times: dict[tuple[str, int], float] = {}
    for op in capture.ops:
        module = op.module or ""
        if op.phase != "forward" or not (module == block or module.startswith(block + ".")):
            continue
        if op.is_view or op.is_inplace or op.write_bytes == 0:
            continue
        name = key_name(op.name)
        occurrence = counts[name]
        counts[name] += 1
        times[(name, occurrence)] = op.device_us if op.device_us is not None else op.wall_us
    return times


def predict_inputs(
    spec: str, params: dict[str, Any], gpu: str = "h200", capture: Any = None
) -> BudgetInputs:
    """Predict the step of workload ``spec`` with ``params`` (on fake tensors, no GPU needed)
    and read the budget inputs from it."""
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.predict import run_prediction, source_of

    found: list[Block] = []
    prediction = run_prediction(
        source_of(spec, params),
        resolve_gpu(gpu),
        num_steps=2,
        transform=lambda workload: found.extend(repeated_blocks(workload.model)),
    )
    return from_prediction(prediction, found, capture, gpu)
