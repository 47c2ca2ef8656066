"""``ac-budget``: the checkpointing plan that is fastest under a peak-memory budget.

Given one block's ops with the bytes each output would keep and the time each would cost to
recompute (:mod:`levers.levers.ac_budget_inputs`: bytes from levers memory's prediction, times
from a GPU capture or estimated), the plan is: checkpoint the first ``k`` blocks, saving in each
the outputs of a set ``S`` of ops and recomputing the rest, and leave the last ``L - k`` blocks
alone. The last block never needs checkpointing: backward recomputes it at once, when the
memory it would free is needed again, so ``k <= L - 1``.

    peak(k, S)      = fixed + k * (output + bytes(S)) + (L - k) * block_activations
    recompute(k, S) = k * (time(all ops) - time(S))

``S`` grows greedily by recompute time per byte saved (the ops that are dearest to recompute
per byte first). Every (k, prefix of that order) is a candidate plan; the candidates that no
other beats on both peak and time form a frontier, and a budget takes the fastest frontier plan
whose predicted peak fits. On that frontier time falls strictly as the peak rises, so a smaller
budget never gets a plan with a larger peak: the choice is monotone in the budget.

The closed form misses the moment of a block's recompute, where the peak can move once blocks
save outputs (up to about one block's activations on the 1b llama). When the workload can be
predicted (the ``workload`` option), the chosen plan is checked by a full prediction of the step
with the plan applied (levers memory, on fake tensors) and chosen again under a budget lowered
by any overshoot (:func:`choose_verified`).

The budget is bytes (``20GiB``, ``512MiB``, ``2e10``) or a fraction of the no-checkpointing
block activations (``0.5``, ``50%``): ``fixed + fraction * L * block_activations``.

Options: ``budget`` (required), and where the inputs come from: ``inputs`` (a
:class:`BudgetInputs`, from Python), or ``workload`` (the workload spec to predict, e.g. ``hf``;
its factory parameters are the workload's own) with ``gpu`` (default ``h200``). From the command
line: ``levers ab hf --set size=1b --lever ac-budget:budget=22GiB:workload=hf``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from levers.levers import register
from levers.levers.ac_budget_inputs import BudgetInputs, OpCost, predict_inputs
from levers.levers.checkpointing import blocks_or_reason, wrap_blocks
from levers.levers.lever import Lever, Target, Undo
from levers.levers.sac import contexts, keyed_policy
from levers.vocab import EXACT

logger = logging.getLogger(__name__)

MAX_VERIFY_ROUNDS = 3
_UNITS = {"gib": 2**30, "gb": 10**9, "mib": 2**20, "mb": 10**6, "kib": 2**10, "b": 1}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class BudgetPlan:
    num_checkpointed: int  # the first k blocks are checkpointed, the rest are not
    save: frozenset[tuple[str, int]]  # the op keys each checkpointed block saves
    saved_bytes_per_block: int  # bytes(S), without the block's output
    predicted_peak_bytes: int
    recompute_us: float  # per step, over all checkpointed blocks


def order_by_value(ops: tuple[OpCost, ...]) -> list[OpCost]:
    """The ops worth saving, dearest recompute per byte first; ties in block order."""
    worth = [op for op in ops if op.saved_bytes > 0 and op.time_us > 0]
    return sorted(worth, key=lambda op: -op.time_us / op.saved_bytes)


def candidate_plans(inputs: BudgetInputs) -> list[BudgetPlan]:
    order = order_by_value(inputs.ops)
    total_us = sum(op.time_us for op in inputs.ops)
    num_blocks = inputs.num_blocks
    plans = [
        BudgetPlan(0, frozenset(), 0, inputs.peak_bytes, 0.0)
    ]  # no checkpointing at all
    for k in range(1, num_blocks):
        saved_bytes, saved_us, keys = 0, 0.0, []
        for j in range(len(order) + 1):
            if j:
                op = order[j - 1]
                saved_bytes += op.saved_bytes
                saved_us += op.time_us
                keys.append(op.key)
            peak = (
                inputs.fixed_bytes
                + k * (inputs.block_output_bytes + saved_bytes)
                + (num_blocks - k) * inputs.block_activation_bytes
            )
            plans.append(
                BudgetPlan(k, frozenset(keys), saved_bytes, peak, k * max(total_us - saved_us, 0.0))
            )
    return plans


def frontier(inputs: BudgetInputs) -> list[BudgetPlan]:
    """The plans no other beats on both predicted peak and recompute time, by rising peak."""
    ranked = sorted(
        candidate_plans(inputs),
        key=lambda p: (p.predicted_peak_bytes, p.recompute_us, p.num_checkpointed, len(p.save)),
    )
    kept: list[BudgetPlan] = []
    for plan in ranked:
        if not kept or plan.recompute_us < kept[-1].recompute_us:
            kept.append(plan)
    return kept


def budget_bytes(budget: Any, inputs: BudgetInputs) -> int:
    """The peak budget in bytes from ``"20GiB"``, a byte count, or a fraction (``0.5``, ``50%``)."""
    text = str(budget).strip()
    if text.endswith("%"):
        fraction = _number(text[:-1], budget) / 100
    elif isinstance(budget, float) or re.fullmatch(r"0?\.\d+|1(\.0*)?", text):
        fraction = _number(text, budget)
    else:
        match = _SIZE.match(text)
        unit = (match.group(2) or "b").lower() if match else ""
        if not match or unit not in _UNITS:
            raise ValueError(
                f"ac-budget: budget {budget!r} is not a size or a fraction; write e.g. 20GiB, "
                "512MiB, 2e10 (bytes) or 0.5 / 50% (of the activations without checkpointing)"
            )
        return int(float(match.group(1)) * _UNITS[unit])
    if not 0 < fraction <= 1:
        raise ValueError(f"ac-budget: a fractional budget must be in (0, 1], got {budget!r}")
    return int(inputs.fixed_bytes + fraction * inputs.activation_bytes)


def _number(text: str, budget: Any) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"ac-budget: cannot read the budget {budget!r}; write e.g. 50%") from None


def choose(inputs: BudgetInputs, budget: Any) -> BudgetPlan:
    """The fastest plan whose predicted peak fits ``budget``."""
    limit = budget_bytes(budget, inputs)
    plans = frontier(inputs)
    fitting = [p for p in plans if p.predicted_peak_bytes <= limit]
    if not fitting:
        smallest = plans[0]
        raise ValueError(
            f"ac-budget: no plan fits {limit / 2**30:.2f} GiB; the smallest predicted peak is "
            f"{smallest.predicted_peak_bytes / 2**30:.2f} GiB (every block but the last "
            "checkpointed, nothing saved). Raise the budget or lower the batch size"
        )
    return fitting[-1]


@dataclass
class BudgetHandle:
    """The undo of ``ac-budget``, with the plan it applied and what it was chosen from."""

    undo: Undo
    plan: BudgetPlan
    inputs: BudgetInputs
    budget_bytes: int

    def __call__(self) -> None:
        self.undo()


def apply_plan(model: Any, inputs: BudgetInputs, plan: BudgetPlan) -> Undo:
    """Checkpoint the first ``plan.num_checkpointed`` blocks of ``inputs.container``, saving
    ``plan.save`` in each; returns the undo."""
    blocks, reason = blocks_or_reason(model)
    if reason is not None:
        raise ValueError(f"ac-budget cannot apply: {reason}")
    blocks = [block for block in blocks if block.container == inputs.container]
    if len(blocks) != inputs.num_blocks:
        raise ValueError(
            f"ac-budget: the inputs describe {inputs.num_blocks} blocks in {inputs.container!r}, "
            f"the model has {len(blocks)} there; predict the workload the lever is applied to"
        )
    make_policy = keyed_policy(plan.save)
    return wrap_blocks(
        model, blocks[: plan.num_checkpointed], lambda position, block: lambda: contexts(make_policy)
    )


def choose_verified(
    inputs: BudgetInputs,
    budget: Any,
    predict_peak: Callable[[BudgetPlan], int],
    *,
    max_rounds: int = MAX_VERIFY_ROUNDS,
) -> tuple[BudgetPlan, int]:
    """The fastest plan whose peak, predicted by running the step with the plan applied
    (``predict_peak``, levers memory on fake tensors), fits ``budget``; and that peak.

    The closed-form peak misses what happens during a block's recompute (the peak can move
    there once blocks save outputs), so each chosen plan is checked by a full prediction and,
    when it overshoots, the plan is chosen again under a budget lowered by the overshoot.
    """
    limit = budget_bytes(budget, inputs)
    target = limit
    for _ in range(max_rounds):
        plan = choose(inputs, target)
        peak = predict_peak(plan)
        if peak <= limit:
            return plan, peak
        target -= peak - limit
    plan = choose(inputs, target)
    return plan, predict_peak(plan)


@dataclass
class BudgetHandle:
    """The undo of ``ac-budget``, with the plan it applied and what it was chosen from."""

    undo: Undo
    plan: BudgetPlan
    inputs: BudgetInputs
    budget_bytes: int
    verified_peak_bytes: int | None = None  # the plan's peak by a full prediction, if run

    def __call__(self) -> None:
        self.undo()


def checkpoint_within(
    model: Any,
    inputs: BudgetInputs,
    budget: Any,
    predict_peak: Callable[[BudgetPlan], int] | None = None,
) -> BudgetHandle:
    """Apply the fastest plan for ``budget`` to ``model``'s repeated blocks (checked by
    ``predict_peak`` when given, see :func:`choose_verified`)."""
    verified = None
    if predict_peak is None:
        plan = choose(inputs, budget)
    else:
        plan, verified = choose_verified(inputs, budget, predict_peak)
    undo = apply_plan(model, inputs, plan)
    logger.info(
        "ac-budget: %d of %d blocks checkpointed, %d ops saved per block (%.0f MiB), predicted "
        "peak %.2f GiB%s, recompute %.1f ms per step (%s times)",
        plan.num_checkpointed,
        inputs.num_blocks,
        len(plan.save),
        plan.saved_bytes_per_block / 2**20,
        plan.predicted_peak_bytes / 2**30,
        "" if verified is None else f" ({verified / 2**30:.2f} GiB by a full prediction)",
        plan.recompute_us / 1e3,
        inputs.time_source,
    )
    return BudgetHandle(undo, plan, inputs, budget_bytes(budget, inputs), verified)


def plan_peak_predictor(
    spec: str, params: dict[str, Any], inputs: BudgetInputs, gpu: str = "h200"
) -> Callable[[BudgetPlan], int]:
    """``predict_peak(plan)``: the peak of workload ``spec`` with ``plan`` applied, predicted
    by levers memory on fake tensors (no GPU needed)."""
    from levers.hardware import resolve_gpu
    from levers.memory.predict import run_prediction, source_of

    def predict_peak(plan: BudgetPlan) -> int:
        prediction = run_prediction(
            source_of(spec, params),
            resolve_gpu(gpu),
            num_steps=2,
            transform=lambda workload: apply_plan(workload.model, inputs, plan),
        )
        return prediction.replay.peak_allocated_bytes

    return predict_peak


def _inputs_of(target: Target) -> BudgetInputs:
    inputs = target.options.get("inputs")
    if inputs is not None:
        return inputs
    return predict_inputs(
        target.options["workload"], target.params, str(target.options.get("gpu", "h200"))
    )


def _predictor_of(target: Target, inputs: BudgetInputs) -> Callable[[BudgetPlan], int] | None:
    if "workload" not in target.options:
        return None
    gpu = str(target.options.get("gpu", "h200"))
    return plan_peak_predictor(target.options["workload"], target.params, inputs, gpu)


def applies(target: Target) -> str | None:
    reason = blocks_or_reason(target.model)[1]
    if reason is not None:
        return reason
    if "budget" not in target.options:
        return "it needs a budget: ac-budget:budget=20GiB (or a fraction: budget=0.5)"
    if "inputs" not in target.options and "workload" not in target.options:
        return (
            "it needs the workload's memory prediction: name the workload to predict, e.g. "
            "ac-budget:budget=20GiB:workload=hf (its parameters are the workload's own)"
        )
    return None


def patch(target: Target) -> Undo:
    inputs = _inputs_of(target)
    return checkpoint_within(
        target.model, inputs, target.options["budget"], _predictor_of(target, inputs)
    )


LEVER = register(
    Lever(
        id="ac-budget",
        title="Checkpoint the blocks to the fastest plan that fits a peak-memory budget",
        safety=EXACT,
        fixes=("MEM001",),
        applies=applies,
        patch=patch,
        options=("budget", "inputs", "workload", "gpu"),
    )
)
