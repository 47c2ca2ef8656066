"""``ac-budget``: the checkpointing plan that is fastest under a peak-memory budget.

Given one block's ops with the bytes each output would keep and the time each would cost to
recompute (:mod:`levers.levers.ac_budget_inputs`: bytes from levers memory's prediction, times
from a GPU capture or estimated), each block gets one of three treatments:

- ``none``: not checkpointed; it keeps all its activations (``block_activations``);
- ``full``: plain non-reentrant checkpointing, no selective context; it keeps its output only
  and recomputes every op;
- ``selective``: checkpointed with a selective policy saving the outputs of a set ``S`` of ops;
  it keeps ``output + bytes(S)`` and recomputes the rest. A selective policy is a
  ``TorchDispatchMode`` called for every aten op of the block, in forward and in the recompute,
  so each selective block also pays ``sac_op_overhead_us`` per op and pass.

The plan checkpoints the first ``f`` blocks fully, the next ``s`` selectively (one ``S`` for
all) and leaves the rest alone (``f + s <= L``)::

    peak      = fixed + f * output + s * (output + bytes(S) + safety)
                + (L - f - s) * block_activations
    recompute = f * time(all) + s * (time(all) - time(S) + 2 * ops_per_block * sac_op_overhead_us)

``S`` grows greedily by recompute time per byte saved (the dearest to recompute per byte
first). Every (f, s, prefix of that order) is a candidate; the candidates that no other beats
on both peak and time form a frontier, and a budget takes the fastest frontier plan whose
predicted peak fits. On that frontier time falls strictly as the peak rises, so a smaller budget
never gets a plan with a larger peak: the choice is monotone in the budget. Where the overhead
outweighs what ``S`` saves (a host-bound eager step), the frontier is "the first ``k`` blocks
full, the rest none", between no checkpointing and checkpointing every block.

``sac_op_overhead_us`` (default :data:`SAC_OP_OVERHEAD_US`) and ``safety`` (a selective block's
:data:`SELECTIVE_PEAK_SAFETY` of one block's activations) are calibrated on the H200: see
``docs/activation-checkpointing.md``.

The closed form misses the moment of a block's recompute, where the peak can move (once blocks
save outputs, or when every block is checkpointed and the last one is recomputed right after the
loss). When the workload can be predicted (the ``workload`` option), each chosen plan is checked
by a full prediction of the step with the plan applied (levers memory, on fake tensors) plus the
selective safety term, and chosen again under a lower budget until one fits
(:func:`choose_verified`); a plan whose checked peak exceeds the budget is never applied.

The budget is bytes (``20GiB``, ``512MiB``, ``2e10``) or a fraction of the no-checkpointing
block activations (``0.5``, ``50%``): ``fixed + fraction * L * block_activations``.

**On compiled blocks.** Where ``compile-blocks`` compiled the blocks (it is applied first in
any stack that names both, whatever the order: ``Lever.after``), the plan above does not
describe the step: the partitioner already recomputes the cheap ops, and a selective policy's
dispatch cost is traced away. The lever then makes the compiled plan instead
(:mod:`levers.levers.ac_budget_compiled`): per block ``none``, a partitioner budget (torch's
``activation_memory_budget``, 0.1 to 0.9, for that block's graph only) or ``full``, chosen by
levers memory's prediction of the compiled step (it needs ``workload``; ``inputs`` and
``sac_op_overhead_us`` do not apply there), never over the budget by that prediction. That
prediction applies the levers applied before ac-budget in the same call (``Target.before``: a
fused loss frees the logits, float8 shrinks what the blocks save), so the plan is held to the
peak of the stack that runs.

Options: ``budget`` (required), ``sac_op_overhead_us``, and where the inputs come from:
``inputs`` (a :class:`BudgetInputs`, from Python), or ``workload`` (the workload spec to
predict, e.g. ``hf``; its factory parameters are the workload's own) with ``gpu`` (default
``h200``). ``levers ab`` names its own candidate as ``workload`` when neither is given
(:func:`levers.ab.lever_lookup.predicting_own_workload`), so from the command line:
``levers ab hf --set size=1b --lever ac-budget:budget=22GiB``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from levers.hardware import resolve_gpu
from levers.levers import register
from levers.levers.ac_budget_compiled import (
    CompiledBudgetHandle,
    compiled_blocks,
    levels_peak_predictor,
    plan_compiled,
)
from levers.levers.ac_budget_inputs import BudgetInputs, OpCost, predict_inputs
from levers.levers.checkpointing import blocks_or_reason, wrap_blocks
from levers.levers.lever import Lever, NotApplicable, Target, Undo
from levers.levers.sac import contexts, keyed_policy
from levers.units import parse_bytes
from levers.vocab import EXACT

logger = logging.getLogger(__name__)

# Host time a selective policy adds per op and pass (forward, recompute), in microseconds.
# From bench/results/ac_policies_h200 (hf llama 1b, batch 4, eager, host-bound): torchtitan's
# op-SAC step took 265.5 ms (30.85k tokens/s) against plain block checkpointing's 193.5 ms
# (42.33k), over 16 blocks x 2 passes x 52 ops per block as ac-budget counts them (the 51 ops
# that write memory and the block's output): 72.0 ms / 1664 = 43.3 us. A floor, since op-SAC
# also recomputes less than plain checkpointing does; at batch 8 (less host-bound) the gap was
# 9.6 ms, so the constant is pessimistic where the GPU, not the host, sets the step time.
SAC_OP_OVERHEAD_US = 43.3
# What a selective block may add to the checked peak, as a fraction of one block's activations:
# on the H200 the measured peak of plans saving ops exceeded the full prediction by up to 9.4%
# of a block's activations per selective block (batch 4 and batch 8 alike); plans with nothing
# saved matched it within 0.04 GiB.
SELECTIVE_PEAK_SAFETY = 0.10
MAX_VERIFY_ROUNDS = 4


@dataclass(frozen=True)
class BudgetPlan:
    num_full: int  # the first blocks: plain checkpointing, no selective context
    num_selective: int  # the next blocks: selective, saving ``save``; the rest are not touched
    save: frozenset[tuple[str, int]]  # the op keys each selective block saves
    saved_bytes_per_block: int  # bytes(S) of a selective block, without the block's output
    predicted_peak_bytes: int  # closed form, selective safety included
    recompute_us: float  # per step, over all checkpointed blocks, selective overhead included
    kept_bytes: int = 0  # what the blocks keep for backward at the end of forward

    @property
    def num_checkpointed(self) -> int:
        return self.num_full + self.num_selective

    def kinds(self, num_blocks: int) -> list[str]:
        """Each block's treatment, in block order: "full", "selective" or "none"."""
        return (
            ["full"] * self.num_full
            + ["selective"] * self.num_selective
            + ["none"] * (num_blocks - self.num_checkpointed)
        )


def order_by_value(ops: tuple[OpCost, ...]) -> list[OpCost]:
    """The ops worth saving, dearest recompute per byte first; ties in block order."""
    worth = [op for op in ops if op.saved_bytes > 0 and op.time_us > 0]
    return sorted(worth, key=lambda op: -op.time_us / op.saved_bytes)


def selective_overhead_us(inputs: BudgetInputs, sac_op_overhead_us: float) -> float:
    """What one selective block adds per step: the policy's call for each op (the block's ops
    and its output op), in forward and in the recompute."""
    return 2 * (len(inputs.ops) + 1) * sac_op_overhead_us


def candidate_plans(
    inputs: BudgetInputs, sac_op_overhead_us: float = SAC_OP_OVERHEAD_US
) -> list[BudgetPlan]:
    order = order_by_value(inputs.ops)
    total_us = sum(op.time_us for op in inputs.ops)
    overhead_us = selective_overhead_us(inputs, sac_op_overhead_us)
    safety = int(SELECTIVE_PEAK_SAFETY * inputs.block_activation_bytes)
    num_blocks = inputs.num_blocks
    output, activations = inputs.block_output_bytes, inputs.block_activation_bytes
    prefixes = []  # (keys, bytes(S), time(S)) for each non-empty prefix of the order
    saved_bytes, saved_us, keys = 0, 0.0, []
    for op in order:
        saved_bytes += op.saved_bytes
        saved_us += op.time_us
        keys.append(op.key)
        prefixes.append((frozenset(keys), saved_bytes, saved_us))
    plans = []
    for num_full in range(num_blocks + 1):
        full_kept = num_full * output
        rest = num_blocks - num_full
        no_selective = full_kept + rest * activations
        plans.append(_plan(inputs, num_full, 0, frozenset(), 0, num_full * total_us, no_selective))
        for num_selective in range(1, rest + 1):
            untouched = (rest - num_selective) * activations
            for save, nbytes, us in prefixes:
                kept = full_kept + num_selective * (output + nbytes) + untouched
                recompute = num_full * total_us + num_selective * (
                    max(total_us - us, 0.0) + overhead_us
                )
                extra = num_selective * safety
                plans.append(
                    _plan(inputs, num_full, num_selective, save, nbytes, recompute, kept, extra)
                )
    return plans


def _plan(
    inputs: BudgetInputs,
    num_full: int,
    num_selective: int,
    save: frozenset[tuple[str, int]],
    saved_bytes: int,
    recompute_us: float,
    kept_bytes: int,
    safety_bytes: int = 0,
) -> BudgetPlan:
    peak = inputs.fixed_bytes + kept_bytes + safety_bytes
    if num_full + num_selective == 0:
        peak = inputs.peak_bytes
    return BudgetPlan(num_full, num_selective, save, saved_bytes, peak, recompute_us, kept_bytes)


def frontier(
    inputs: BudgetInputs, sac_op_overhead_us: float = SAC_OP_OVERHEAD_US
) -> list[BudgetPlan]:
    """The plans no other beats on both predicted peak and recompute time, by rising peak."""
    ranked = sorted(
        candidate_plans(inputs, sac_op_overhead_us),
        key=lambda p: (
            p.predicted_peak_bytes,
            p.recompute_us,
            p.num_selective,
            p.num_checkpointed,
            len(p.save),
        ),
    )
    kept: list[BudgetPlan] = []
    for plan in ranked:
        if not kept or plan.recompute_us < kept[-1].recompute_us:
            kept.append(plan)
    return kept


def budget_bytes(budget: Any, inputs: BudgetInputs) -> int:
    """The peak budget in bytes from ``"20GiB"``, a byte count, or a fraction (``0.5``, ``50%``)."""
    if isinstance(budget, int) and not isinstance(budget, bool):
        return budget
    text = str(budget).strip()
    if text.endswith("%"):
        fraction = _number(text[:-1], budget) / 100
    elif isinstance(budget, float) or re.fullmatch(r"0?\.\d+|1(\.0*)?", text):
        fraction = _number(text, budget)
    else:
        try:
            return parse_bytes(text)
        except ValueError:
            raise ValueError(
                f"ac-budget: budget {budget!r} is not a size or a fraction; write e.g. 20GiB, "
                "512MiB, 2e10 (bytes) or 0.5 / 50% (of the activations without checkpointing)"
            ) from None
    if not 0 < fraction <= 1:
        raise ValueError(f"ac-budget: a fractional budget must be in (0, 1], got {budget!r}")
    return int(inputs.fixed_bytes + fraction * inputs.activation_bytes)


def _number(text: str, budget: Any) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"ac-budget: cannot read the budget {budget!r}; write e.g. 50%") from None


def choose(
    inputs: BudgetInputs, budget: Any, sac_op_overhead_us: float = SAC_OP_OVERHEAD_US
) -> BudgetPlan:
    """The fastest plan whose predicted peak fits ``budget``."""
    limit = budget_bytes(budget, inputs)
    plans = frontier(inputs, sac_op_overhead_us)
    fitting = [p for p in plans if p.predicted_peak_bytes <= limit]
    if not fitting:
        smallest = plans[0]
        raise NotApplicable(
            f"ac-budget: no plan fits {limit / 2**30:.2f} GiB; the smallest predicted peak is "
            f"{smallest.predicted_peak_bytes / 2**30:.2f} GiB ({_describe(smallest, inputs)}). "
            "Raise the budget or lower the batch size"
        )
    return fitting[-1]


def _describe(plan: BudgetPlan, inputs: BudgetInputs) -> str:
    parts = []
    if plan.num_full:
        parts.append(f"{plan.num_full} of {inputs.num_blocks} blocks fully checkpointed")
    if plan.num_selective:
        parts.append(f"{plan.num_selective} selective saving {len(plan.save)} ops")
    return ", ".join(parts) or "no checkpointing"


def apply_plan(model: Any, inputs: BudgetInputs, plan: BudgetPlan) -> Undo:
    """Checkpoint the first ``plan.num_full`` blocks of ``inputs.container`` plainly (no
    selective context) and the next ``plan.num_selective`` saving ``plan.save``; returns the
    undo."""
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

    def context_fn_for(position: int, block: Any) -> Callable[[], Any]:
        if position < plan.num_full:
            return lambda: None  # plain checkpointing: no dispatch mode per op
        return lambda: contexts(make_policy)

    return wrap_blocks(model, blocks[: plan.num_checkpointed], context_fn_for)


def checked_peak(plan: BudgetPlan, inputs: BudgetInputs, predicted_peak: int) -> int:
    """A full prediction's peak plus the selective safety term (what it missed on the H200)."""
    return predicted_peak + int(
        plan.num_selective * SELECTIVE_PEAK_SAFETY * inputs.block_activation_bytes
    )


def choose_verified(
    inputs: BudgetInputs,
    budget: Any,
    predict_peak: Callable[[BudgetPlan], int],
    *,
    max_rounds: int = MAX_VERIFY_ROUNDS,
    sac_op_overhead_us: float = SAC_OP_OVERHEAD_US,
) -> tuple[BudgetPlan, int]:
    """The fastest plan whose checked peak (:func:`checked_peak` of ``predict_peak``, levers
    memory on fake tensors with the plan applied) fits ``budget``; and that peak.

    The closed-form peak misses what happens during a block's recompute, so each chosen plan is
    checked by a full prediction and, when it overshoots, the plan is chosen again under a
    budget lowered by the overshoot (and at least below the plan's own closed-form peak, so
    every round tries a smaller plan). Raises when no plan is found to fit within
    ``max_rounds`` predictions: a plan over the budget is never returned.
    """
    limit = budget_bytes(budget, inputs)
    plan = choose(inputs, limit, sac_op_overhead_us)  # raises when nothing fits even closed-form
    smallest = frontier(inputs, sac_op_overhead_us)[0].predicted_peak_bytes
    for _ in range(max_rounds):
        peak = checked_peak(plan, inputs, predict_peak(plan))
        if peak <= limit:
            return plan, peak
        if plan.predicted_peak_bytes <= smallest:  # the smallest plan was tried: none fits
            break
        # another plan's error need not be this one's: never aim below the smallest plan
        target = min(limit - (peak - plan.predicted_peak_bytes), plan.predicted_peak_bytes - 1)
        plan = choose(inputs, max(target, smallest), sac_op_overhead_us)
    raise NotApplicable(
        f"ac-budget: no plan found whose checked peak fits {limit / 2**30:.2f} GiB (the last "
        f"tried, {_describe(plan, inputs)}, peaks at {peak / 2**30:.2f} GiB by a full "
        "prediction). Raise the budget or lower the batch size"
    )


@dataclass
class BudgetHandle:
    """The undo of ``ac-budget``, with the plan it applied and what it was chosen from."""

    undo: Undo
    plan: BudgetPlan
    inputs: BudgetInputs
    budget_bytes: int
    verified_peak_bytes: int | None = None  # the plan's checked peak by a full prediction

    def __call__(self) -> None:
        self.undo()


def checkpoint_within(
    model: Any,
    inputs: BudgetInputs,
    budget: Any,
    predict_peak: Callable[[BudgetPlan], int] | None = None,
    sac_op_overhead_us: float = SAC_OP_OVERHEAD_US,
) -> BudgetHandle:
    """Apply the fastest plan for ``budget`` to ``model``'s repeated blocks (checked by
    ``predict_peak`` when given, see :func:`choose_verified`)."""
    verified = None
    if predict_peak is None:
        plan = choose(inputs, budget, sac_op_overhead_us)
    else:
        plan, verified = choose_verified(
            inputs, budget, predict_peak, sac_op_overhead_us=sac_op_overhead_us
        )
    undo = apply_plan(model, inputs, plan)
    logger.info(
        "ac-budget: %s of %d blocks, %d ops saved per selective block (%.0f MiB), predicted "
        "peak %.2f GiB%s, recompute %.1f ms per step (%s times)",
        _describe(plan, inputs),
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
    # the memory model, imported when the lever predicts (levers.levers)
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
        target.options["workload"], gpu_params(target.params),
        str(target.options.get("gpu", "h200")),
    )


def _predictor_of(target: Target, inputs: BudgetInputs) -> Callable[[BudgetPlan], int] | None:
    if "workload" not in target.options:
        return None
    gpu = str(target.options.get("gpu", "h200"))
    predict = plan_peak_predictor(target.options["workload"], gpu_params(target.params), inputs,
                                  gpu)
    return lambda plan: _predicted(predict, plan)


def _predicted(predict: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``predict(*args, **kwargs)``, a prediction that fails on this model (an op the fake
    tensors of levers memory cannot run, a model that checks its values) turned into the
    lever's refusal with what failed: the plan rests on the prediction, so there is none."""
    try:
        return predict(*args, **kwargs)
    except ValueError:  # an option's or the lever's own refusal, already in its words
        raise
    except Exception as exc:  # noqa: BLE001 - any failure of the prediction is the answer
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotApplicable(
            f"ac-budget: levers memory could not predict this step ({type(exc).__name__}: "
            f"{first[:300]}), and the plan rests on that prediction; ac-full and ac-selective "
            "checkpoint without one"
        ) from exc


def applies_to_model(target: Target) -> str | None:
    """Why the model has nothing to checkpoint, whatever the options (no repeated blocks)."""
    return blocks_or_reason(target.model)[1]


def applies(target: Target) -> str | None:
    reason = applies_to_model(target)
    if reason is not None:
        return reason
    if "budget" not in target.options:
        return "it needs a budget: ac-budget:budget=20GiB (or a fraction: budget=0.5)"
    if "inputs" not in target.options and "workload" not in target.options:
        return (
            "it needs the workload's memory prediction: name the workload to predict, e.g. "
            "ac-budget:budget=20GiB:workload=hf (its parameters are the workload's own; levers ab "
            "names its own candidate)"
        )
    return None


def _overhead_of(options: dict[str, Any]) -> float:
    raw = options.get("sac_op_overhead_us", SAC_OP_OVERHEAD_US)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        value = -1.0
    if value < 0:
        raise ValueError(
            f"ac-budget: sac_op_overhead_us must be microseconds >= 0 (e.g. 43.3), got {raw!r}"
        )
    return value


def gpu_params(params: dict[str, Any]) -> dict[str, Any]:
    """The factory parameters of the predicted step: a device given for the side that runs here
    (device=cpu) is dropped, so the factory gets the GPU the memory model stands in for."""
    return {k: v for k, v in params.items() if k != "device"}


def check_options(options: dict[str, Any]) -> None:
    """Refuse a bad option before any prediction (a budget that is not a size or a fraction,
    an unknown GPU, a negative overhead), each with its own message."""
    if "budget" in options:
        # a fraction is checked for its range only here: the inputs that scale it come later
        budget_bytes(options["budget"], SimpleNamespace(fixed_bytes=0, activation_bytes=1))
    if "gpu" in options:
        resolve_gpu(str(options["gpu"]))
    _overhead_of(options)


def patch_compiled(target: Target) -> CompiledBudgetHandle:
    """The compiled plan (:mod:`levers.levers.ac_budget_compiled`), for blocks that
    compile-blocks compiled: a partitioner budget per block, chosen by levers memory's
    prediction of the compiled step."""
    if "workload" not in target.options:
        raise NotApplicable(
            "ac-budget on compiled blocks plans by a prediction of the compiled step: name the "
            "workload to predict, e.g. ac-budget:budget=18GiB:workload=hf (inputs= describes "
            "the eager step)"
        )
    budget = target.options["budget"]
    budget_bytes(budget, SimpleNamespace(fixed_bytes=0, activation_bytes=1))  # refuse it early

    def limit_of(lowest_peak: int, highest_peak: int) -> int:
        span = SimpleNamespace(
            fixed_bytes=lowest_peak, activation_bytes=max(highest_peak - lowest_peak, 0)
        )
        return budget_bytes(budget, span)

    predict_levels = levels_peak_predictor(
        target.options["workload"],
        gpu_params(target.params),
        str(target.options.get("gpu", "h200")),
        stack=target.before,
    )
    return plan_compiled(target.model, limit_of,
                         lambda *a, **k: _predicted(predict_levels, *a, **k))


def patch(target: Target) -> Undo:
    check_options(target.options)
    if compiled_blocks(target.model):  # compile-blocks came first (Lever.after sees to it)
        return patch_compiled(target)
    overhead = _overhead_of(target.options)
    inputs = _predicted(_inputs_of, target)
    return checkpoint_within(
        target.model, inputs, target.options["budget"], _predictor_of(target, inputs), overhead
    )


LEVER = register(
    Lever(
        id="ac-budget",
        title="Checkpoint the blocks to the fastest plan that fits a peak-memory budget",
        safety=EXACT,
        fixes=("MEM001",),
        applies=applies,
        applies_to_model=applies_to_model,
        patch=patch,
        options=("budget", "sac_op_overhead_us", "inputs", "workload", "gpu"),
        check=check_options,
        after=("compile-blocks",),
    )
)
