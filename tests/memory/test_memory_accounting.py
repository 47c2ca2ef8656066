"""What a fake step allocates on the stand-in GPU, checked against bytes worked out by hand."""

from __future__ import annotations

import weakref
from collections import defaultdict

import memory_factories as factories
import pytest
import torch

from levers.memory import predict_memory
from levers.memory.fake import trace_workload
from levers.memory.shadow import DRAW_ASSUMPTION, _ShadowTable
from levers.hardware import resolve_gpu

MIB = 1 << 20
H100 = resolve_gpu("h100-80gb")
PARAM_BYTES = 16 * 32 * 4 + 32 * 4 + 32 * 4 * 4 + 4 * 4  # 2704


@pytest.fixture(scope="module")
def mlp_trace():
    trace, _ = trace_workload(lambda: factories.mlp(device="cuda"), H100, num_steps=2)
    return trace


def _bytes_by(trace, **where) -> int:
    return sum(
        a.nbytes for a in trace.allocations if all(getattr(a, k) == v for k, v in where.items())
    )


def test_parameters_gradients_and_adamw_state_are_exact(mlp_trace):
    assert _bytes_by(mlp_trace, category="parameters") == PARAM_BYTES
    for step in (0, 1):
        assert _bytes_by(mlp_trace, category="gradients", step=step) == PARAM_BYTES
    # fused AdamW: exp_avg and exp_avg_sq per parameter, and a float32 step on the device
    assert _bytes_by(mlp_trace, category="optimizer") == 2 * PARAM_BYTES + 4 * 4
    assert _bytes_by(mlp_trace, category="optimizer", step=1) == 0  # made once, kept


def test_saved_activations_are_the_ones_backward_needs(mlp_trace):
    saved = sorted(
        (a.op, a.module, a.nbytes)
        for a in mlp_trace.allocations
        if a.category == "activations" and a.step == 0 and a.nbytes > 4
    )
    # addmm keeps its input x, ReLU its output, mse_loss its input and the target
    assert saved == [
        ("aten.addmm.default", "2", 8 * 4 * 4),
        ("aten.randn.default", None, 8 * 4 * 4),
        ("aten.randn.default", None, 8 * 16 * 4),
        ("aten.relu.default", "1", 8 * 32 * 4),
    ]
    # the first Linear's output is not saved (ReLU keeps its own output): a temporary
    first = [a for a in mlp_trace.allocations if a.module == "0" and a.op == "aten.addmm.default"]
    assert {a.category for a in first} == {"temporaries"}


def test_kernel_workspaces(mlp_trace):
    workspaces = defaultdict(int)
    for allocation in mlp_trace.allocations:
        if allocation.category == "workspace":
            workspaces[(allocation.op, allocation.phase)] += allocation.nbytes
    assert dict(workspaces) == {
        ("cuBLAS workspace", "forward"): 32 * MIB,  # sm90: one per thread
        ("cuBLAS workspace", "backward"): 32 * MIB,
        ("cuBLASLt workspace", "forward"): MIB,  # the biased Linear's addmm
    }


def test_the_peak_adds_up_to_blocks_worked_out_by_hand():
    plan = predict_memory(factories.mlp, H100, num_steps=2)
    by_category = {entry.category: entry.nbytes for entry in plan.by_category}
    # every tensor here is at most 2 KiB: each takes 512-byte blocks
    assert by_category == {
        "workspace": 65 * MIB,
        "optimizer": 2 * (2048 + 512 + 512 + 512) + 4 * 512,
        "parameters": 2048 + 512 + 512 + 512,
        "gradients": 2048 + 512 + 512 + 512,  # the last one (bias of layer 0) just arrived
        "activations": 4 * 512,  # x, target, loss and backward's seed, not yet freed
        "temporaries": 1024,  # ReLU's input gradient
    }
    assert plan.peak_allocated_bytes == sum(by_category.values())
    assert (plan.peak.phase, plan.peak.step, plan.peak.op) == (
        "backward",
        1,
        "aten.sum.dim_IntList",
    )
    # two 32 MiB cuBLAS segments, and the small pool's 2 MiB holds the Lt workspace and the rest
    assert plan.peak_reserved_bytes == 66 * MIB


def test_a_model_larger_than_this_machine_costs_no_memory():
    plan = predict_memory(factories.huge, H100, num_steps=1, params={})
    weight_bytes = 50_000 * 50_000 * 4
    by_category = {entry.category: entry.nbytes for entry in plan.by_category}
    assert by_category["parameters"] == weight_bytes
    assert by_category["optimizer"] == 2 * weight_bytes + 512
    assert plan.fits  # 40 GB of weights, gradients and state on an 80 GB card
    assert not predict_memory(factories.huge, "30GiB", num_steps=1).fits


def test_unfused_adamw_keeps_its_step_on_the_host_and_computes_temporaries():
    trace, _ = trace_workload(lambda: factories.mlp(device="cuda", fused=False), H100, num_steps=2)
    # the step counters live on the CPU in a GPU run: only exp_avg and exp_avg_sq are on it
    assert _bytes_by(trace, category="optimizer") == 2 * PARAM_BYTES
    sqrt = [a for a in trace.allocations if a.op == "aten._foreach_sqrt.default" and a.step == 1]
    assert sum(a.nbytes for a in sqrt) == PARAM_BYTES
    assert all(a.state_derived for a in sqrt)


def test_fake_tensors_stand_in_for_the_gpu_in_the_workload_code():
    trace, workload = trace_workload(
        lambda: factories.device_moves(device="cuda"), H100, num_steps=1
    )
    seen = workload.params["seen"]
    assert seen["x_device"] == "cuda" and seen["is_cuda"] is True
    # the model was built on the host and moved: only the moved copies are GPU memory
    assert _bytes_by(trace, category="parameters") == 4 * 4 * 4 + 4 * 4
    # the host copy of the loss is not GPU memory
    assert all(
        a.op != "aten._to_copy.default" or a.phase == "build"
        for a in trace.allocations
        if a.step == 0 and a.phase == "other"
    )


def test_values_read_by_the_step_come_from_shadows():
    trace, _ = trace_workload(lambda: factories.data_dependent(device="cuda"), H100, num_steps=1)
    picked = [a for a in trace.allocations if a.op == "aten.index.Tensor"]
    assert [a.shape for a in picked] == [(5, 8)]  # five labels are not -100
    assert trace.assumptions == ()


@pytest.mark.parametrize("collator", [False, True], ids=["rand", "bernoulli-of-full"])
def test_rows_selected_by_a_random_draw_are_counted_from_a_draw_on_the_host(collator):
    # a masked LM's targets drawn at 15%: the rows the step selects are ~15% of the 4096 tokens
    # (the host's draw, not the step's: a binomial count, 614 +- 23), where they were all assumed
    trace, _ = trace_workload(
        lambda: factories.drawn_targets(device="cuda", collator=collator), H100, num_steps=1)
    logits = [a.shape for a in trace.allocations if a.shape[-1:] == (512,) and a.step == 0
              and a.op == "aten.addmm.default"]
    assert logits and all(500 <= shape[0] <= 730 for shape in logits)
    assert trace.assumptions == (DRAW_ASSUMPTION,)


def test_a_draw_that_nothing_reads_is_no_assumption():
    # the mlp step draws its inputs (torch.randn), and reads none of them
    trace, _ = trace_workload(lambda: factories.mlp(device="cuda"), H100, num_steps=1)
    assert trace.assumptions == ()


def test_a_module_cast_while_the_model_is_built_is_predicted():
    # its small parameter has a shadow; a weak reference to it stopped Module._apply's swap
    trace, _ = trace_workload(lambda: factories.retyped(device="cuda"), H100, num_steps=1)
    assert {a.shape for a in trace.allocations if a.op == "aten.mul.Tensor"} >= {(4, 8)}


def test_a_shadow_is_found_by_its_tensor_and_not_by_a_view_of_its_storage():
    table = _ShadowTable()
    base = torch.arange(6)
    table[base] = base + 1
    assert weakref.getweakrefs(base) == []  # swap_tensors refuses a weakly referenced tensor
    assert torch.equal(table.get(base), base + 1)
    assert table.get(base[2:]) is None and table.get(base.view(2, 3)) is None
    assert torch.equal(table.pop(base), base + 1) and table.get(base) is None


def test_the_prediction_leaves_torch_as_it_found_it():
    before = (torch.Generator, torch.utils.swap_tensors, torch.clear_autocast_cache)
    trace_workload(lambda: factories.mlp(device="cuda"), H100, num_steps=1)
    assert (torch.Generator, torch.utils.swap_tensors, torch.clear_autocast_cache) == before
    x = torch.randn(4, 4)
    assert x.device.type == "cpu" and torch.mm(x, x).dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # CPU autocast's own list is back: softmax is not on it
        assert torch.softmax(x.bfloat16(), -1).dtype == torch.bfloat16
