"""``ac-budget`` on compiled blocks: a per-block activation memory budget for the partitioner.

Under ``compile-blocks`` each block is one graph that AOTAutograd's min-cut partitioner splits
into forward and backward; what it keeps for backward is torch's
``torch._functorch.config.activation_memory_budget`` (a ratio: 1.0 keeps what runs fastest,
0.0 what checkpointing the whole region keeps; the partitioner solves a knapsack between).
Torch reads it once per process, for every graph. Here each block gets its own level:

- ``none``: compiled as is (the ratio torch would use, 1.0 by default);
- a ratio (``"0.1"`` to ``"0.9"``): the partitioner of this block's graph runs at that ratio;
- ``full``: the partitioner at ratio 0, which keeps the graph's inputs only and recomputes the
  rest, as checkpointing the whole block does (not ``torch.utils.checkpoint`` inside the
  compiled block: that graph runs ``run_and_save_rng_state``, which levers memory's tracker
  cannot run, so such a plan could not be predicted).

**How a ratio is scoped to one block.** The config is read when the block's graph is
partitioned, which happens inside the block's compiled call the first time dynamo compiles it.
So the compiled call (``_compiled_call_impl``) is wrapped to set the ratio for the call and put
the previous value back (no torch global outlives a call; setting and restoring it took 24 us
per call on a 2-core CPU, 0.4 ms per step over 16 blocks). Blocks of one class share one
dynamo program, though: to give each ratio a program of its own, the block's ``forward`` is
wrapped by one that reads its ratio as a string constant, which dynamo guards by value (a float
would be traced as a symbolic input after its first change, and every ratio would share the
first one's partition). Blocks at the same ratio still share one program. The ratio is in the
AOTAutograd cache's key (the functorch config is), so a cached graph of another ratio is never
reused. Checked on a CPU (tests/levers/test_ac_budget_compiled.py): with inductor and with
``aot_eager_decomp_partition`` the tensors a block saves fall with its ratio, blocks at two
ratios compile two programs, and the loss is unchanged. Torch 2.13 also has
``torch.autograd.graph.region_activation_memory_budget``, which does this inside the graph;
the H200 runs torch 2.11, which lacks it.

**The plan.** The peak of a step comes at the start of the backward, where every block's saved
tensors are alive; what a block saves counts once at that moment, whichever block it is, so
for identical blocks the cheapest way to save bytes is to spread them evenly (the partitioner's
recompute cost per byte saved rises as a block's ratio falls: measured on the H200, hf llama
1b at batch 4, 1.7 ms per GiB at ratio 0.5 and 2.3 ms at full checkpointing). One exception:
the last block's backward starts right away, so when the step's peak is at that moment (and
not at the loss, which holds the logits) what the last block saves is recomputed or kept at
the same moment and checkpointing it saves nothing. The plans form one chain, from every block
``full`` to every block ``none``, each step raising one block one level (``full``, ``0.1``,
..., ``0.9``, ``none``), round robin from the last block backwards so that the levels of the
blocks differ by at most one. When leaving the last block ``none`` does not raise the predicted
peak of the all-``full`` plan, the chain starts by doing that and the round robin covers the
other blocks. Along the chain each step keeps more (the predicted peak rises) and recomputes
less; the plan is the furthest along it whose predicted peak fits the budget, found by
bisection over full predictions.

**Predictions, not measurements.** Every peak here is levers memory's prediction of the
compiled step on fake tensors (:mod:`levers.memory.compiled`: inductor's decompositions and
min-cut partition at the block's ratio, the graphs' ops run one by one with inductor's fused
elementwise intermediates left unbooked); on the H200 the no-checkpointing compiled step
of the hf llama 1b at batch 4 was predicted at 24.09 GiB and measured at 24.09. The speed order
of the chain is the partitioner's own (a lower ratio never recomputes less); no time is
estimated.

The budget is bytes, or a fraction ``f`` (``0.5``, ``50%``) between the predicted peaks of the
all-``full`` (0) and all-``none`` (1) plans. A budget under the all-``full`` plan's predicted
peak is refused with that peak.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._functorch import config as functorch_config

from levers.blocks import Block, repeated_blocks
from levers.hardware import resolve_gpu
from levers.levers import compile_blocks
from levers.levers._compile_setup import is_compiled
from levers.levers.handle import replay
from levers.levers.lever import NotApplicable, Undo

logger = logging.getLogger(__name__)

FULL, NONE = "full", "none"
RATIOS = tuple(f"0.{i}" for i in range(1, 10))
# a block's levels, from the most recomputed to the least
LEVELS = (FULL, *RATIOS, NONE)
# the partitioner's budget for each level but none: full is its ratio 0, which saves the
# graph's inputs only (what checkpointing the whole block keeps). Not torch.utils.checkpoint
# inside the compiled block: its graph runs run_and_save_rng_state, which levers memory's
# tracker cannot run, so that plan could not be predicted
BUDGET_OF = {FULL: 0.0, **{ratio: float(ratio) for ratio in RATIOS}}

Levels = tuple[str, ...]  # one level per block, in block order
# levers applied before ac-budget, each (id, its options): lever.Target.before
Stack = Sequence[tuple[str, dict[str, Any]]]


@dataclass(frozen=True)
class CompiledPlan:
    levels: Levels  # per block: "none", a ratio ("0.5") or "full"
    predicted_peak_bytes: int  # levers memory's prediction of the compiled step with the plan
    last_block_free: bool  # leaving the last block unchecked did not raise the predicted peak
    position: int  # along the chain, from 0 (every block full, or all but a free last block)
    num_positions: int
    num_predictions: int = 0  # full predictions the search made
    predicted_peaks: dict[Levels, int] = field(default_factory=dict, compare=False, repr=False)

    def counts(self) -> dict[str, int]:
        """How many blocks are at each level, by level (levels with no block left out)."""
        return {level: self.levels.count(level) for level in LEVELS if level in self.levels}

    def describe(self) -> str:
        parts = [f"{n} at {level}" for level, n in self.counts().items()]
        return ", ".join(parts) + f" of {len(self.levels)} blocks"


def chain(num_blocks: int, last_block_free: bool) -> list[tuple[int, int]]:
    """The chain's steps, each ``(block, level index)``: the block raised to that level. From
    every block ``full``: the last block to ``none`` first when it is free, then round robin
    from the last (other) block backwards, one level at a time."""
    steps: list[tuple[int, int]] = []
    num_rest = num_blocks
    if last_block_free and num_blocks > 1:
        steps.append((num_blocks - 1, len(LEVELS) - 1))
        num_rest = num_blocks - 1
    for level in range(1, len(LEVELS)):
        steps.extend((block, level) for block in reversed(range(num_rest)))
    return steps


def levels_at(steps: list[tuple[int, int]], num_blocks: int, position: int) -> Levels:
    indices = [0] * num_blocks
    for block, level in steps[:position]:
        indices[block] = level
    return tuple(LEVELS[i] for i in indices)


def choose_compiled(
    num_blocks: int,
    limit_of: Callable[[int, int], int],
    predict_peak: Callable[[Levels], int],
) -> CompiledPlan:
    """The plan furthest along the chain (least recompute) whose predicted peak fits the budget.

    ``limit_of(lowest_peak, highest_peak)`` is the budget in bytes given the predicted peaks of
    the all-full and all-none plans (a fraction is read between them); ``predict_peak(levels)``
    is the peak of the compiled step with those levels (levers memory,
    :func:`levels_peak_predictor`). Each distinct plan is predicted once. Raises when even every
    block ``full`` is predicted over the budget."""
    peaks: dict[Levels, int] = {}

    def peak_of(levels: Levels) -> int:
        if levels not in peaks:
            peaks[levels] = predict_peak(levels)
        return peaks[levels]

    lowest = (FULL,) * num_blocks
    lowest_peak = peak_of(lowest)
    # the chain's far end: predicted for a fractional budget, and by the search anyway
    limit = limit_of(lowest_peak, peak_of((NONE,) * num_blocks))
    if lowest_peak > limit:
        raise NotApplicable(
            f"ac-budget: no plan fits {limit / 2**30:.2f} GiB on the compiled blocks; the smallest "
            f"predicted peak, every block fully checkpointed, is {lowest_peak / 2**30:.2f} GiB. "
            "Raise the budget or lower the batch size"
        )
    free = num_blocks > 1 and peak_of(lowest[:-1] + (NONE,)) <= lowest_peak
    steps = chain(num_blocks, free)

    def fits(position: int) -> bool:
        return peak_of(levels_at(steps, num_blocks, position)) <= limit

    low, high = 0, len(steps)  # fits(low); the furthest fitting position is in [low, high]
    if fits(high):
        low = high
    while high - low > 1:
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    levels = levels_at(steps, num_blocks, low)
    return CompiledPlan(
        levels, peaks[levels], free, low, len(steps), len(peaks), dict(peaks)
    )


def compiled_blocks(model: torch.nn.Module) -> list[Block]:
    """The repeated blocks that ``compile-blocks`` compiled, of the container with the most of
    them (a decoder's layers rather than a vision tower's): the blocks a compiled plan covers."""
    blocks = [b for b in repeated_blocks(model) if is_compiled(b.module)]
    by_container: dict[str, list[Block]] = {}
    for block in blocks:
        by_container.setdefault(block.container, []).append(block)
    if not by_container:
        return []
    return max(by_container.values(), key=len)


def _guarded(original: Callable[..., Any], ratio: str) -> Callable[..., Any]:
    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        # dynamo guards this string by value, so each ratio compiles a program of its own (a
        # float would become a symbolic input and every ratio share the first's partition)
        if ratio not in BUDGET_OF:
            raise AssertionError(f"not a ratio level: {ratio!r}")
        return original(*args, **kwargs)

    return forward


def _scoped(compiled: Callable[..., Any], ratio: float) -> Callable[..., Any]:
    """The compiled call with the partitioner's budget set to ``ratio`` while it runs: it is
    read when the call compiles (and partitions) the block's graph."""

    def call(*args: Any, **kwargs: Any) -> Any:
        previous = functorch_config.activation_memory_budget
        functorch_config.activation_memory_budget = ratio
        try:
            return compiled(*args, **kwargs)
        finally:
            functorch_config.activation_memory_budget = previous

    return call


def apply_levels(model: torch.nn.Module, levels: Levels) -> Undo:
    """Give each compiled block of ``model`` its level; returns the undo, which puts back each
    block's ``forward`` and compiled call."""
    blocks = compiled_blocks(model)
    if len(blocks) != len(levels):
        raise ValueError(
            f"ac-budget: the plan has {len(levels)} levels and the model {len(blocks)} compiled "
            "blocks; apply compile-blocks first and plan for the model the plan is applied to"
        )
    unknown = sorted(set(levels) - set(LEVELS))
    if unknown:
        raise ValueError(f"ac-budget: unknown block levels {unknown}; levels are {LEVELS}")
    changed: list[tuple[torch.nn.Module, Any]] = []
    for block, level in zip(blocks, levels):
        if level == NONE:
            continue
        module = block.module
        assert "forward" not in vars(module), f"{block.path} is already wrapped"
        compiled = vars(module)["_compiled_call_impl"]
        module.forward = _guarded(module.forward, level)
        module._compiled_call_impl = _scoped(compiled, BUDGET_OF[level])
        changed.append((module, compiled))

    def undo() -> None:
        for module, compiled in changed:
            vars(module).pop("forward", None)
            module._compiled_call_impl = compiled

    return undo


def compile_with_levels(workload: Any, levels: Levels, stack: Stack = ()) -> None:
    """The step a compiled plan runs, as a prediction's transform: the levers of ``stack`` (those
    applied before ac-budget, each with its options; compile-blocks among them, or added first),
    then ``levels``. Levers whose kernels cannot run on fake tensors are left out
    (``levers.memory.prediction.NOT_PREDICTED``)."""
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.prediction import NOT_PREDICTED

    stack = [(lever_id, options) for lever_id, options in stack if lever_id not in NOT_PREDICTED]
    if compile_blocks.LEVER.id not in {lever_id for lever_id, _ in stack}:
        stack.insert(0, (compile_blocks.LEVER.id, {}))
    replay(workload, stack)
    apply_levels(workload.model, levels)


def levels_peak_predictor(
    spec: str, params: dict[str, Any], gpu: str = "h200", stack: Stack = ()
) -> Callable[[Levels], int]:
    """``predict_peak(levels)``: the peak allocated memory of workload ``spec`` built with
    ``params``, the levers of ``stack`` applied (the run's levers before ac-budget: a fused
    loss or float8 changes the peak the plan is held to), its blocks compiled (compile-blocks)
    at ``levels``, predicted by levers memory on fake tensors (no GPU needed)."""
    # the memory model, imported when the lever predicts (levers.levers)
    from levers.memory.prediction import run_prediction, source_of

    def predict_peak(levels: Levels) -> int:
        prediction = run_prediction(
            source_of(spec, params),
            resolve_gpu(gpu),
            num_steps=2,
            transform=lambda workload: compile_with_levels(workload, levels, stack),
        )
        peak = prediction.replay.peak_allocated_bytes
        logger.debug("ac-budget: %s predicted at %.3f GiB", " ".join(levels), peak / 2**30)
        return peak

    return predict_peak


@dataclass
class CompiledBudgetHandle:
    """The undo of ``ac-budget`` on compiled blocks, with the plan it applied."""

    undo: Undo
    plan: CompiledPlan
    budget_bytes: int | None = None

    def __call__(self) -> None:
        self.undo()


def plan_compiled(
    model: torch.nn.Module,
    limit_of: Callable[[int, int], int],
    predict_peak: Callable[[Levels], int],
) -> CompiledBudgetHandle:
    """Choose the compiled plan (:func:`choose_compiled`) and apply it."""
    blocks = compiled_blocks(model)
    plan = choose_compiled(len(blocks), limit_of, predict_peak)
    undo = apply_levels(model, plan.levels)
    logger.info(
        "ac-budget on compiled blocks: %s (%s), predicted peak %.2f GiB by levers memory "
        "(%d predictions; the last block %s)",
        plan.describe(),
        " ".join(plan.levels),
        plan.predicted_peak_bytes / 2**30,
        plan.num_predictions,
        "is free: left unchecked" if plan.last_block_free else "counts at the peak",
    )
    highest = plan.predicted_peaks[(NONE,) * len(blocks)]
    lowest = plan.predicted_peaks[(FULL,) * len(blocks)]
    return CompiledBudgetHandle(undo, plan, limit_of(lowest, highest))
