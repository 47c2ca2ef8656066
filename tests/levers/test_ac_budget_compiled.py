"""ac-budget on compiled blocks: a partitioner budget per block that really changes what the
block saves, the plan's choice (monotone in the budget, the last block left unchecked where
that does not raise the peak), the order of the stack, parity with compile-blocks alone and
the undo."""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import sys
from pathlib import Path

import pytest
import torch
from torch._functorch import config as functorch_config

import levers
from levers.blocks import repeated_blocks
from levers.levers import load_all
from levers.levers.ac_budget_compiled import (
    FULL,
    LEVELS,
    NONE,
    apply_levels,
    chain,
    choose_compiled,
    levels_at,
    levels_peak_predictor,
)
from levers.levers.handle import in_order
from levers.loader import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lever_parity import assert_close, run_steps, state_of  # noqa: E402

pytest.importorskip("transformers")

# AOTAutograd with the min-cut partitioner (the one that reads the budget) and no code
# generation: the CPU stand-in for inductor, which partitions the same way
BACKEND = "aot_eager_decomp_partition"
TINY = {"size": "tiny", "device": "cpu"}


def _compiled_tiny():
    torch._dynamo.reset()
    workload = load_workload("hf", dict(TINY))
    handle = levers.apply(workload, f"compile-blocks:backend={BACKEND}")
    return workload, handle


def _one_step(workload) -> tuple[float, int]:
    """The loss and the bytes autograd saved for backward."""
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    workload.model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = float(workload.step())
    return loss, saved[0]


def _predict_tiny(levels):
    return levels_peak_predictor("hf", {"size": "tiny"}, "h200")(levels)


@pytest.fixture(scope="module")
def tiny_peak():
    """The predicted peak of the tiny hf llama compiled per block at ``levels``, each levels
    predicted once for the module's tests (a prediction on fake tensors takes seconds on a
    2-core CPU; the plan's search predicts each levels once as well).

    The predictions run in a fresh interpreter: after ~130 other tests of the suite in one
    process (ab, audit and capture tests that compile and capture), the all-full plan's
    prediction came out 239 KB (0.3%) higher, above the 0.3 ratio's, though each of those test
    files before this module left it as in a fresh process; the cause was not found. These
    tests are about the plan's order over predictions, so they take them from a clean process.
    """
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as worker:
        peaks: dict = {}

        def memo(levels):
            if levels not in peaks:
                peaks[levels] = worker.submit(_predict_tiny, levels).result()
            return peaks[levels]

        yield memo


def _unique_graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _step_at(levels) -> tuple[float, int, int]:
    """A fresh tiny hf llama (seed 0) compiled per block at ``levels``: its first loss, the
    bytes autograd saved for backward, and the programs dynamo compiled."""
    workload, handle = _compiled_tiny()
    undo = apply_levels(workload.model, levels)
    torch._dynamo.utils.counters.clear()
    loss, saved = _one_step(workload)
    num_graphs = _unique_graphs()
    undo()
    handle.undo()
    return loss, saved, num_graphs


def test_a_blocks_ratio_changes_what_it_saves_and_compiles_a_program_per_ratio():
    none = _step_at((NONE, NONE))
    half = _step_at(("0.5", "0.5"))
    full = _step_at((FULL, FULL))
    mixed = _step_at(("0.3", "0.7"))
    # the same loss, less saved as the ratio falls
    for other in (half, full, mixed):
        assert other[0] == pytest.approx(none[0], rel=1e-6)
    assert none[1] > half[1] > full[1]
    assert full[1] < mixed[1] < none[1]
    # blocks at one ratio share a program; blocks at two ratios compile one each
    assert (none[2], half[2], full[2], mixed[2]) == (1, 1, 1, 2)


def _synthetic(last_block_free: bool):
    """A predictor: a fixed 1000 bytes plus what each block saves (100 at full, +100 per
    level); with a free last block its saving never counts (its backward starts at once)."""

    def saved(level: str) -> int:
        return 100 * (LEVELS.index(level) + 1)

    calls: list = []

    def predict(levels):
        calls.append(levels)
        counted = list(levels[:-1]) + [NONE if last_block_free else levels[-1]]
        return 1000 + sum(saved(level) for level in counted)

    return predict, calls


def test_the_chain_keeps_the_levels_within_one_of_each_other():
    steps = chain(4, last_block_free=False)
    assert len(steps) == 4 * (len(LEVELS) - 1)
    for position in range(len(steps) + 1):
        indices = [LEVELS.index(level) for level in levels_at(steps, 4, position)]
        assert max(indices) - min(indices) <= 1
        assert indices == sorted(indices)  # the later blocks first
    assert levels_at(steps, 4, len(steps)) == (NONE,) * 4
    free = chain(4, last_block_free=True)
    assert levels_at(free, 4, 1) == (FULL, FULL, FULL, NONE)


@pytest.mark.parametrize("last_block_free", [False, True])
def test_the_plan_is_monotone_in_the_budget_and_never_over_it(last_block_free):
    predict, _ = _synthetic(last_block_free)
    lowest = predict((FULL,) * 4)
    highest = predict((NONE,) * 4)
    previous = None
    for budget in range(highest + 50, lowest - 1, -37):  # shrinking
        plan = choose_compiled(4, lambda lo, hi, b=budget: b, predict)
        assert plan.predicted_peak_bytes <= budget
        assert plan.predicted_peak_bytes == predict(plan.levels)
        if previous is not None:
            assert plan.predicted_peak_bytes <= previous.predicted_peak_bytes
            assert plan.position <= previous.position
        # the furthest along the chain: one more step would not fit
        steps = chain(4, plan.last_block_free)
        if plan.position < len(steps):
            assert predict(levels_at(steps, 4, plan.position + 1)) > budget
        previous = plan
    assert plan.levels[:3] == (FULL,) * 3


def test_the_last_block_is_left_unchecked_where_that_does_not_raise_the_peak():
    free, _ = _synthetic(last_block_free=True)
    counted, _ = _synthetic(last_block_free=False)
    smallest = free((FULL,) * 4)
    plan = choose_compiled(4, lambda lo, hi: smallest, free)
    assert plan.last_block_free and plan.levels == (FULL, FULL, FULL, NONE)
    plan = choose_compiled(4, lambda lo, hi: counted((FULL,) * 4), counted)
    assert not plan.last_block_free and plan.levels == (FULL,) * 4


def test_a_budget_under_the_smallest_plan_is_refused_with_that_peak():
    predict, _ = _synthetic(last_block_free=False)
    with pytest.raises(ValueError, match="every block fully checkpointed, is 0.00 GiB"):
        choose_compiled(4, lambda lo, hi: lo - 1, predict)


def test_each_plan_is_predicted_once():
    predict, calls = _synthetic(last_block_free=False)
    choose_compiled(4, lambda lo, hi: (lo + hi) // 2, predict)
    assert len(calls) == len(set(calls))


def test_ac_budget_follows_compile_blocks_in_a_stack():
    registry = load_all()
    stack = [(registry[name], {}) for name in ("ac-budget", "rms-norm-fused", "compile-blocks")]
    assert [lever.id for lever, _ in in_order(stack)] == [
        "rms-norm-fused",
        "compile-blocks",
        "ac-budget",
    ]
    kept = [(registry[name], {}) for name in ("compile-blocks", "rms-norm-fused", "ac-budget")]
    assert in_order(kept) == kept


@pytest.mark.slow
def test_compile_blocks_and_ac_budget_in_either_order_keep_parity_and_undo_everything(
    tiny_peak,
):
    torch._dynamo.reset()
    plain = load_workload("hf", dict(TINY))
    with levers.apply(plain, f"compile-blocks:backend={BACKEND}"):
        expected = run_steps(plain)

    middle = (tiny_peak((FULL, FULL)) + tiny_peak((NONE, NONE))) // 2
    torch._dynamo.reset()
    workload = load_workload("hf", dict(TINY))
    before = state_of(workload.model)
    budget_before = functorch_config.activation_memory_budget
    handle = levers.apply(
        workload,
        [f"ac-budget:budget={middle}:workload=hf", f"compile-blocks:backend={BACKEND}"],
    )
    assert handle.applied == ["compile-blocks", "ac-budget"]
    plan = handle.patches["ac-budget"].plan
    assert plan.predicted_peak_bytes <= middle
    assert plan.levels != (NONE, NONE) and plan.levels != (FULL, FULL)
    got = run_steps(workload)
    assert functorch_config.activation_memory_budget == budget_before  # set per call only
    handle.undo()
    # compile-blocks' tolerance: what the partitioner recomputes is the same arithmetic
    assert_close(got, expected, rtol=1e-5)
    # the parameters trained on; everything else as it was
    assert before[1] == state_of(workload.model)[1]
    for block in (b.module for b in repeated_blocks(workload.model)):
        assert "forward" not in vars(block)
        assert "_compiled_call_impl" not in vars(block)
    assert functorch_config.activation_memory_budget == budget_before


@pytest.mark.slow
def test_on_a_prediction_the_peak_rises_with_the_ratio_and_the_plan_is_monotone(tiny_peak):
    memo = tiny_peak
    uniform = [memo((level, level)) for level in (FULL, "0.3", "0.7", NONE)]
    assert uniform == sorted(uniform) and uniform[0] < uniform[-1]
    previous = None
    for budget in (uniform[3], uniform[2], (uniform[1] + uniform[2]) // 2, uniform[0]):
        plan = choose_compiled(2, lambda lo, hi, b=budget: b, memo)
        assert plan.predicted_peak_bytes <= budget
        if previous is not None:
            assert plan.position <= previous.position
            assert plan.predicted_peak_bytes <= previous.predicted_peak_bytes
        previous = plan
    assert previous.levels == (FULL, FULL)


@pytest.mark.slow
def test_the_plan_is_made_for_the_stack_that_runs(tiny_peak):
    # a fused loss applied before ac-budget frees the logits at the peak: the plan is held to
    # the peak of the step with that loss, not of compile-blocks alone, and keeps more
    fused = [("fused-linear-cross-entropy", {"kernel": "chunked", "chunk_rows": 16})]
    with_loss = levels_peak_predictor("hf", {"size": "tiny"}, "h200", stack=fused)
    lightest = with_loss((NONE, NONE))
    # a budget between the two: without the fused loss, leaving every block unchecked would be
    # over it
    assert lightest < tiny_peak((NONE, NONE))
    budget = (lightest + tiny_peak((NONE, NONE))) // 2

    torch._dynamo.reset()
    workload = load_workload("hf", dict(TINY))
    handle = levers.apply(
        workload,
        f"compile-blocks:backend={BACKEND},fused-linear-cross-entropy:kernel=chunked:chunk_rows=16,"
        f"ac-budget:budget={budget}:workload=hf",
    )
    assert handle.applied == ["compile-blocks", "fused-linear-cross-entropy", "ac-budget"]
    assert [lever_id for lever_id, _ in handle.target.before] == handle.applied[:2]
    assert handle.target.before[1][1] == {"kernel": "chunked", "chunk_rows": "16"}
    assert handle.patches["ac-budget"].plan.levels == (NONE, NONE)
    handle.undo()
