"""ac-full, ac-selective and ac-budget: bitwise parity with no checkpointing in fp32 on a CPU,
undo, the matmul log, and the budget solver's choices."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

from levers.blocks import repeated_blocks
from levers.levers import load_all
from levers.levers.ac_budget import (
    SELECTIVE_PEAK_SAFETY,
    BudgetPlan,
    apply_plan,
    budget_bytes,
    choose,
    frontier,
)
from levers.levers.ac_budget_inputs import BudgetInputs, OpCost
from levers.levers.ac_selective import MatmulDecision
from levers.levers.lever import NotApplicable, apply, parse_lever_spec
from levers.loader import load_workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
import vit_like  # noqa: E402

NUM_STEPS = 2


def _hf_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


WORKLOADS = {
    "llama": lambda: load_workload("llama", {}),
    "hf-llama": lambda: load_workload("hf", {"size": "tiny"}),
    "vit-like": lambda: vit_like.build(),
    "demo": lambda: load_workload("demo", {}),
}


def synthetic_inputs(model: torch.nn.Module) -> BudgetInputs:
    """Inputs that make ac-budget checkpoint some blocks and save some matmuls in them."""
    blocks = repeated_blocks(model)
    container = blocks[-1].container
    num_blocks = sum(1 for b in blocks if b.container == container)
    ops = tuple(
        OpCost(name, i, 100, 10.0 + i, 0)
        for name in ("aten.mm.default", "aten.addmm.default")
        for i in range(3)
    ) + tuple(OpCost("aten.mul.Tensor", i, 100, 1.0, 0) for i in range(3))
    return BudgetInputs(
        ops=ops,
        container=container,
        num_blocks=num_blocks,
        block_activation_bytes=2000,
        block_output_bytes=10,
        peak_bytes=10_000,
        time_source="estimated",
    )


def middle_budget(inputs: BudgetInputs) -> int:
    plans = frontier(inputs, sac_op_overhead_us=0)  # a mix of full, selective and none
    return plans[len(plans) // 2].predicted_peak_bytes


def lever_options(name: str, workload) -> dict:
    if name == "ac-selective":
        return {"mm_flops_threshold": 0}
    if name == "ac-budget":
        inputs = synthetic_inputs(workload.model)
        return {"inputs": inputs, "budget": middle_budget(inputs), "sac_op_overhead_us": 0}
    return {}


def run_steps(workload) -> tuple[list[torch.Tensor], list[dict[str, torch.Tensor]], int]:
    """Losses, every step's gradients, and the bytes autograd kept outside checkpoints."""
    grads: list[dict[str, torch.Tensor]] = []
    hooks = []
    for name, param in workload.model.named_parameters():
        if param.requires_grad:

            def hook(p, name=name):
                grads[-1][name] = p.grad.detach().clone()

            hooks.append(param.register_post_accumulate_grad_hook(hook))
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    losses = []
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for _ in range(NUM_STEPS):
            grads.append({})
            losses.append(workload.step())
    for h in hooks:
        h.remove()
    return losses, grads, saved[0]


@pytest.mark.parametrize("workload_name", list(WORKLOADS))
@pytest.mark.parametrize("lever_id", ["ac-full", "ac-selective", "ac-budget"])
def test_bitwise_parity_and_undo(workload_name: str, lever_id: str) -> None:
    if workload_name == "hf-llama" and not _hf_available():
        pytest.skip("transformers is not installed")
    lever = load_all()[lever_id]
    baseline, candidate = WORKLOADS[workload_name](), WORKLOADS[workload_name]()
    config = getattr(candidate.model, "config", None)
    if config is not None:
        config.use_cache = True  # to see it turned off for the lever and restored by the undo
    _, undo = apply(candidate, lever, lever_options(lever_id, candidate))
    if config is not None:
        assert config.use_cache is False

    base_losses, base_grads, base_saved = run_steps(baseline)
    losses, grads, saved = run_steps(candidate)

    for a, b in zip(base_losses, losses, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(base_grads, grads, strict=True):
        assert a.keys() == b.keys() and a
        for name in a:
            assert torch.equal(a[name], b[name]), name
    # the lever did checkpoint: autograd kept fewer bytes outside the checkpoints
    assert saved < base_saved

    undo()
    assert all("forward" not in vars(block.module) for block in repeated_blocks(candidate.model))
    if config is not None:
        assert config.use_cache is True
    after_losses, _, after_saved = run_steps(candidate)
    assert after_saved == base_saved


def test_selective_logs_each_matmul_once_with_exact_shapes_and_flops(caplog) -> None:
    workload = load_workload("llama", {})  # tiny: 2 x 64 tokens, width 64, qkv 128, ffn 128
    with caplog.at_level(logging.INFO, logger="levers.levers.ac_selective"):
        _, undo = apply(workload, load_all()["ac-selective"], {"mm_flops_threshold": "2e6"})
        run_steps(workload)
    matmuls = undo.handle.matmuls
    mm = "aten.mm.default"
    assert matmuls == [
        MatmulDecision("blocks.0", mm, 0, ((128, 64), (64, 128)), 2_097_152, True,
                       "every other matmul: saved"),
        MatmulDecision("blocks.0", mm, 1, ((128, 64), (64, 64)), 1_048_576, False,
                       "under the FLOP threshold: recomputed"),
        MatmulDecision("blocks.0", mm, 2, ((128, 64), (64, 256)), 4_194_304, False,
                       "every other matmul: recomputed"),
        MatmulDecision("blocks.0", mm, 3, ((128, 128), (128, 64)), 2_097_152, True,
                       "every other matmul: saved"),
    ]  # fmt: skip
    assert len([r for r in caplog.records if "ac-selective" in r.getMessage()]) == 4
    undo()


def _abc_inputs() -> BudgetInputs:
    # per block: C is dearest to recompute per byte, then A, then B; 4 blocks of 400 bytes
    ops = (
        OpCost("A", 0, 100, 10.0, 0),
        OpCost("B", 0, 100, 1.0, 0),
        OpCost("C", 0, 50, 20.0, 0),
    )
    return BudgetInputs(ops, "blocks", 4, 400, 10, 2000, "estimated")


def test_solver_picks_the_fastest_plan_that_fits() -> None:
    inputs = _abc_inputs()
    assert inputs.fixed_bytes == 400
    safety = int(SELECTIVE_PEAK_SAFETY * 400)  # 40 per selective block
    # without dispatch overhead: peak = 400 + f * 10 + s * (10 + saved + 40) + rest * 400
    plan = choose(inputs, 1100, sac_op_overhead_us=0)
    assert (plan.num_full, plan.num_selective, plan.save) == (0, 3, {("C", 0)})
    assert plan.predicted_peak_bytes == 400 + 3 * (10 + 50 + safety) + 400 == 1100
    assert plan.recompute_us == pytest.approx(3 * 11.0)
    plan = choose(inputs, 1400, sac_op_overhead_us=0)
    assert (plan.num_full, plan.num_selective, plan.save) == (0, 3, {("C", 0), ("A", 0)})
    assert plan.predicted_peak_bytes == 1400
    plan = choose(inputs, 800, sac_op_overhead_us=0)
    assert (plan.num_full, plan.num_selective, plan.save) == (0, 4, {("C", 0)})
    # the last block may be checkpointed too: every block full is the smallest plan
    plan = choose(inputs, 440, sac_op_overhead_us=0)
    assert (plan.num_full, plan.num_selective, plan.predicted_peak_bytes) == (4, 0, 440)
    with pytest.raises(ValueError, match="no plan fits"):
        choose(inputs, 439, sac_op_overhead_us=0)


def test_dispatch_overhead_makes_the_frontier_full_then_none() -> None:
    inputs = _abc_inputs()
    # each selective block pays 2 passes x 4 ops x 10 us = 80 us, more than a whole recompute
    plans = frontier(inputs, sac_op_overhead_us=10.0)
    assert [(p.num_full, p.num_selective) for p in plans] == [(4, 0), (3, 0), (2, 0), (1, 0), (0, 0)]
    assert [p.predicted_peak_bytes for p in plans] == [440, 830, 1220, 1610, 2000]
    assert [p.recompute_us for p in plans] == [124.0, 93.0, 62.0, 31.0, 0.0]
    budgets = range(2100, 430, -10)  # shrinking
    chosen = [choose(inputs, b, sac_op_overhead_us=10.0) for b in budgets]
    assert all(p.num_selective == 0 and p.save == frozenset() for p in chosen)
    peaks = [p.predicted_peak_bytes for p in chosen]
    assert peaks == sorted(peaks, reverse=True)
    assert all(p.predicted_peak_bytes <= b for p, b in zip(chosen, budgets))
    # a small overhead leaves selective blocks worth their saving: C saves 20 of 31 us
    cheap = choose(inputs, 800, sac_op_overhead_us=1.0)
    assert (cheap.num_selective, cheap.save) == (4, {("C", 0)})


def test_a_plan_of_full_blocks_uses_no_selective_context(monkeypatch) -> None:
    import levers.block_checkpoint as checkpointing

    calls: list[bool] = []
    real = checkpointing.checkpoint

    def spy(fn, *args, **kwargs):
        calls.append("context_fn" in kwargs)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(checkpointing, "checkpoint", spy)
    workload = load_workload("llama", {})
    inputs = synthetic_inputs(workload.model)
    full = BudgetPlan(inputs.num_blocks, 0, frozenset(), 0, 0, 0.0)
    undo = apply_plan(workload.model, inputs, full)
    workload.step()
    undo()
    assert calls == [False] * inputs.num_blocks
    calls.clear()
    mixed = BudgetPlan(1, 1, frozenset({("aten.mm.default", 0)}), 100, 0, 0.0)
    undo = apply_plan(workload.model, inputs, mixed)
    workload.step()
    undo()
    assert calls == [False, True]


def test_budget_spellings() -> None:
    inputs = BudgetInputs((), "blocks", 4, 400, 10, 2000, "estimated")
    assert budget_bytes("20GiB", inputs) == 20 * 2**30
    assert budget_bytes("512MiB", inputs) == 512 * 2**20
    assert budget_bytes("2e10", inputs) == 20_000_000_000
    assert budget_bytes("0.5", inputs) == 400 + 800
    assert budget_bytes("25%", inputs) == 400 + 400
    with pytest.raises(ValueError, match="20GiB"):
        budget_bytes("twenty", inputs)
    assert parse_lever_spec("ac-budget:budget=20GiB:workload=hf") == (
        "ac-budget",
        {"budget": "20GiB", "workload": "hf"},
    )


def test_budget_choice_is_monotone_on_a_cpu_prediction() -> None:
    from levers.levers.ac_budget_inputs import predict_inputs

    inputs = predict_inputs("llama", {"size": "tiny", "batch_size": 4})
    # without the H200's dispatch overhead, so that selective plans are on the frontier too
    plans = frontier(inputs, sac_op_overhead_us=0)
    assert len(plans) > 5
    low, high = plans[0].predicted_peak_bytes, inputs.peak_bytes
    budgets = [high - (high - low) * i // 20 for i in range(21)]  # shrinking
    chosen = [choose(inputs, b, sac_op_overhead_us=0) for b in budgets]
    kept = [p.predicted_peak_bytes for p in chosen]
    assert all(a >= b for a, b in zip(kept, kept[1:]))
    assert kept[0] > kept[-1]
    assert all(p.predicted_peak_bytes <= b for p, b in zip(chosen, budgets))
    assert [p.recompute_us for p in chosen] == sorted(p.recompute_us for p in chosen)


def test_budget_needs_a_budget_and_inputs() -> None:
    workload = load_workload("llama", {})
    lever = load_all()["ac-budget"]
    with pytest.raises(NotApplicable, match="budget=20GiB"):
        apply(workload, lever)
    with pytest.raises(NotApplicable, match="workload=hf"):
        apply(workload, lever, {"budget": "1GiB"})
    with pytest.raises(ValueError, match="accepts: budget"):
        apply(workload, lever, {"budjet": "1GiB"})


def test_verified_choice_lowers_the_budget_by_the_overshoot() -> None:
    from levers.levers.ac_budget import choose_verified

    inputs = _abc_inputs()
    asked = []

    def predict_peak(plan):  # a full prediction that finds 100 bytes more than the closed form
        asked.append((plan.num_full, plan.num_selective, plan.predicted_peak_bytes))
        return plan.predicted_peak_bytes + 100 - plan.num_selective * 40

    # 1100 (3 selective, C) checks at 1200: lowered by 100 to 1000; 4 selective (800) checks
    # at 900 <= 1100
    plan, peak = choose_verified(inputs, 1100, predict_peak, sac_op_overhead_us=0)
    assert asked == [(0, 3, 1100), (0, 4, 800)]
    assert (plan.num_selective, plan.save, peak) == (4, {("C", 0)}, 900)


def test_verified_choice_never_returns_a_plan_over_the_budget() -> None:
    from levers.levers.ac_budget import choose_verified

    inputs = _abc_inputs()
    with pytest.raises(ValueError, match="no plan"):
        choose_verified(inputs, 900, lambda plan: 10_000, sac_op_overhead_us=10.0)
    # one that fits only at the smallest plan: reached, not overshot
    plan, peak = choose_verified(
        inputs, 900, lambda plan: plan.predicted_peak_bytes + 450, sac_op_overhead_us=10.0
    )
    assert (plan.num_full, peak) == (4, 890)


def test_verified_choice_tries_the_smallest_plan_when_a_larger_one_overshoots() -> None:
    from levers.levers.ac_budget import choose_verified

    inputs = _abc_inputs()

    # the last block's recompute: every-block-full predicts 400 above its closed form (840),
    # 3 of 4 full 500 above (1330); lowering 900 by that overshoot would aim under the smallest
    # plan (440): a 900 budget still lands on every block full, not on an error
    def predict_peak(plan):
        return plan.predicted_peak_bytes + (400 if plan.num_full == 4 else 500)

    plan, peak = choose_verified(inputs, 900, predict_peak, sac_op_overhead_us=10.0)
    assert (plan.num_full, plan.num_selective, peak) == (4, 0, 840)


def test_budget_options_are_checked_before_the_prediction() -> None:
    # budget=abc used to reach the prediction first and hide behind its message
    workload = load_workload("llama", {"size": "tiny", "device": "cpu"})
    lever = load_all()["ac-budget"]
    with pytest.raises(ValueError, match="budget 'abc' is not a size or a fraction"):
        apply(workload, lever, {"budget": "abc", "workload": "llama"})
    with pytest.raises(ValueError, match="fractional budget must be in"):
        apply(workload, lever, {"budget": "150%", "workload": "llama"})


def test_a_prediction_that_fails_on_the_model_is_the_lever_s_refusal(monkeypatch) -> None:
    # the CPU arch sweep: levers memory's prediction raised on jetmoe (split_with_sizes on fake
    # tensors), ibert (a NaN assert on values), fnet (no bf16 FFT), ...: ac-budget raised the
    # RuntimeError itself. Its plan rests on the prediction: it now refuses, saying what failed
    import levers.levers.ac_budget as ac_budget

    def fails(*args, **kwargs):
        raise RuntimeError("split_with_sizes expects split_sizes to sum exactly to 128\nmore")

    monkeypatch.setattr(ac_budget, "predict_inputs", fails)
    workload = load_workload("llama", {"size": "tiny", "batch_size": 2, "device": "cpu"})
    before = {name: dict(vars(m)) for name, m in workload.model.named_modules()}
    lever = load_all()["ac-budget"]
    with pytest.raises(NotApplicable, match=r"^ac-budget: levers memory could not predict this "
                       r"step \(RuntimeError: split_with_sizes expects split_sizes to sum "
                       r"exactly to 128\), .* ac-full and ac-selective checkpoint without one"):
        apply(workload, lever, {"budget": "1GiB", "workload": "llama"})
    assert {name: dict(vars(m)) for name, m in workload.model.named_modules()} == before


def test_budget_predicts_the_gpu_step_whatever_the_side_runs_on() -> None:
    # the side runs on the CPU (device=cpu): the prediction still builds it on the stand-in GPU,
    # not with "the factory kept parameters on the CPU"
    from levers.levers.ac_budget import gpu_params

    workload = load_workload("llama", {"size": "tiny", "batch_size": 2, "device": "cpu"})
    assert "device" not in gpu_params(workload.params)
    lever = load_all()["ac-budget"]
    apply(workload, lever, {"budget": "1GiB", "workload": "llama"})  # predicted, applied


def test_a_bad_budget_is_refused_when_the_spec_is_read() -> None:
    # levers ab reads --lever specs before it builds anything: exit 2, not a bug report
    from levers.levers.handle import find_specs

    with pytest.raises(ValueError, match="budget 'abc' is not a size"):
        find_specs(["ac-budget:budget=abc:workload=hf"])
    assert find_specs(["ac-budget:budget=22GiB:workload=hf"])[0][1]["budget"] == "22GiB"


@pytest.mark.parametrize("policy", ["ac-selective", "ac-full"])
def test_checkpointing_runs_inside_compiled_blocks(policy):
    """Selective checkpointing inside compile-blocks: dynamo takes the policy's context_fn (it
    refused one made while tracing: NestedUserFunctionVariable), and the step keeps its loss."""
    pytest.importorskip("transformers")
    import torch

    import levers
    from levers.workloads import zoo

    torch._dynamo.reset()
    plain = zoo.build(model="llama", size="tiny", device="cpu")
    expected = float(plain.step())
    workload = zoo.build(model="llama", size="tiny", device="cpu")
    with levers.apply(workload, ["compile-blocks", policy], backend="eager"):
        loss = float(workload.step())
        workload.step()
    assert loss == pytest.approx(expected, rel=1e-4)
