"""The capture's records on small models, with exact expectations."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import fixture_models
from levers.capture import capture_step
from levers.capture.records import Capture
from levers.errors import StepError


@pytest.fixture(scope="module")
def net_capture():
    return capture_step(fixture_models.net(), warmup=1, timed=1)


def _names(ops, phase):
    return [op.name for op in ops if op.phase == phase]


def test_linear_step_ops_phases_modules_and_flops(mark_line):
    capture = capture_step(fixture_models.linear(), warmup=1, timed=0)
    ops = capture.ops
    assert _names(ops, "forward") == [
        "aten.t.default",
        "aten.addmm.default",
        "aten.sum.default",
        "aten.ones_like.default",
    ]
    # SGD without momentum or foreach: one in-place add per parameter
    assert _names(ops, "optimizer") == ["aten.add_.Tensor", "aten.add_.Tensor"]
    addmm = ops[1]
    assert addmm.module == ""  # the model itself
    assert addmm.source.line == mark_line("linear")
    assert addmm.source.code == "loss = model(x).sum()  # mark: linear"
    assert addmm.flops == 2 * 5 * 4 * 3
    assert [m.shape for m in addmm.inputs] == [(3,), (5, 4), (4, 3)]
    assert addmm.outputs[0].shape == (5, 3) and addmm.outputs[0].dtype == "float32"
    assert addmm.read_bytes == (3 + 20 + 12) * 4 and addmm.write_bytes == 15 * 4
    assert ops[0].is_view and ops[0].read_bytes == 0 and ops[0].write_bytes == 0

    backward = [op for op in ops if op.phase == "backward"]
    mms = [op for op in backward if op.name == "aten.mm.default"]
    assert len(mms) == 1  # the input needs no gradient: only grad_weight = grad_out^T x
    assert mms[0].forward_op == addmm.index
    assert mms[0].autograd_node == "AddmmBackward0"
    assert mms[0].module == "" and mms[0].source == addmm.source
    assert mms[0].flops == 2 * 3 * 5 * 4
    # each optimizer op touches exactly one parameter, so it is attributed to its module
    assert all(op.module == "" for op in ops if op.phase == "optimizer")
    assert sum(op.flops for op in ops) == 2 * 5 * 4 * 3 + 2 * 3 * 5 * 4


def test_flops_match_flop_counter_mode():
    workload = fixture_models.net(seed=3)
    capture = capture_step(workload, warmup=1, timed=0)
    reference = fixture_models.net(seed=3)
    reference.step()
    with FlopCounterMode(display=False) as counter:
        reference.step()
    # FlopCounterMode has no formula for the CPU flash-attention kernel; add ours for it
    cpu_flash = sum(op.flops for op in capture.ops if "flash_attention_for_cpu" in op.name)
    assert cpu_flash > 0
    assert sum(op.flops for op in capture.ops) == counter.get_total_flops() + cpu_flash


def test_sdpa_flops_counted_like_the_gpu_kernels(net_capture):
    fwd = [op for op in net_capture.ops if op.name.endswith("flash_attention_for_cpu.default")]
    bwd = [op for op in net_capture.ops if "flash_attention_for_cpu_backward" in op.name]
    assert len(fwd) == 2 and len(bwd) == 2
    b, h, t, d = 2, 4, 6, 4
    assert fwd[0].flops == 2 * b * h * t * t * (d + d)
    assert bwd[0].flops == 2 * fwd[0].flops


def test_module_paths_and_sources(net_capture, mark_line):
    ops = net_capture.ops
    addmms = [op for op in ops if op.phase == "forward" and op.name == "aten.addmm.default"]
    assert [op.module for op in addmms] == ["blocks.0.fc", "blocks.1.fc"]
    assert all(op.source.line == mark_line("mlp") for op in addmms)
    relus = [op for op in ops if op.phase == "forward" and op.name == "aten.relu.default"]
    assert [op.module for op in relus] == ["blocks.0", "blocks.1"]
    head = [op for op in ops if op.phase == "forward" and op.module == "head"]
    assert head and all(op.source.line == mark_line("head") for op in head)
    loss_ops = [op for op in ops if op.name == "aten.nll_loss_forward.default"]
    assert loss_ops[0].module is None  # computed in the step, outside the model
    assert loss_ops[0].source.line == mark_line("loss")
    assert net_capture.modules["blocks.0.attn"] == "Attn"


def test_backward_ops_inherit_forward_attribution(net_capture):
    ops = net_capture.ops
    backward = [op for op in ops if op.phase == "backward" and op.forward_op is not None]
    assert backward
    for op in backward:
        fwd = ops[op.forward_op]
        assert fwd.phase == "forward"
        assert (op.module, op.source) == (fwd.module, fwd.source)
    sdpa_bwd = [op for op in ops if "flash_attention_for_cpu_backward" in op.name]
    assert [op.module for op in sdpa_bwd] == ["blocks.1.attn", "blocks.0.attn"]
    # gradient accumulation is attributed to the module owning the parameter
    accumulate = [op for op in ops if op.autograd_node == "torch::autograd::AccumulateGrad"]
    assert {op.module for op in accumulate} == {
        "blocks.0.attn.q", "blocks.0.attn.kv", "blocks.0.fc",
        "blocks.1.attn.q", "blocks.1.attn.kv", "blocks.1.fc", "head",
    }


def test_phases_in_order(net_capture):
    phases = [op.phase for op in net_capture.ops]
    first = {p: phases.index(p) for p in ("forward", "backward", "optimizer")}
    assert first["forward"] < first["backward"] < first["optimizer"]
    # nothing of the forward runs after the backward began
    assert "forward" not in phases[first["backward"]:]
    metric = [c for c in net_capture.calls if c.kind == "memory_metric"]
    assert [c.phase for c in metric] == ["other"]


def test_sdpa_call_record(net_capture, mark_line):
    sdpa = [c for c in net_capture.calls if c.kind == "sdpa"]
    assert len(sdpa) == 2
    call = sdpa[0]
    assert call.module == "blocks.0.attn"
    assert call.source.line == mark_line("sdpa")
    args = call.args
    assert args["query"]["shape"] == [2, 4, 6, 4]
    assert args["key"]["shape"] == [2, 2, 6, 4]
    assert args["attn_mask"] == {"shape": [6, 6], "dtype": "float32", "device": "cpu"}
    assert args["is_causal"] is False and args["enable_gqa"] is True
    assert args["dropout_p"] == 0.0 and args["scale"] is None
    assert sorted(args["backends_enabled"]) == ["FLASH_ATTENTION", "MATH"]
    assert args["backend_ran"] == "FLASH_ATTENTION_CPU"
    assert net_capture.ops[call.first_op].name.endswith("flash_attention_for_cpu.default")


def test_loss_call_record(net_capture, mark_line):
    (loss,) = [c for c in net_capture.calls if c.kind == "loss"]
    assert loss.name == "cross_entropy" and loss.source.line == mark_line("loss")
    assert loss.args["ignore_index"] == -100 and loss.args["reduction"] == "mean"
    assert loss.args["num_targets"] == 12 and loss.args["num_ignored"] == 4
    assert loss.args["ignored_fraction"] == pytest.approx(4 / 12)
    assert loss.args["input"]["shape"] == [12, 12]


def test_sync_call_records(net_capture, mark_line):
    user_syncs = [
        (c.name, c.source.line)
        for c in net_capture.calls
        if c.kind == "sync" and not c.args["caller_in_torch"]
    ]
    assert user_syncs == [
        ("Tensor.__int__", mark_line("int")),
        ("Tensor.__bool__", mark_line("bool")),
        ("Tensor.__getitem__", mark_line("boolindex")),
    ]
    for call in net_capture.calls:
        if call.kind == "sync" and call.first_op is not None:
            names = {op.name for op in net_capture.ops[call.first_op : call.last_op + 1]}
            assert names & {"aten._local_scalar_dense.default", "aten.nonzero.default",
                            "aten.index.Tensor"}


def test_memory_metric_calls_recorded_and_restored(net_capture, mark_line):
    (metric,) = [c for c in net_capture.calls if c.kind == "memory_metric"]
    assert metric.name == "torch.cuda.max_memory_allocated"
    assert metric.source.line == mark_line("maxmem")
    # the wrapper is gone after the capture
    assert not hasattr(torch.cuda.max_memory_allocated, "__levers_original__")
    assert torch.cuda.max_memory_allocated is torch.cuda.memory.max_memory_allocated


@pytest.mark.parametrize(
    "code, expected",
    [
        ("t.sum().item()", ["Tensor.item"]),
        ("float(t.sum())", ["Tensor.__float__"]),
        ("t.tolist()", ["Tensor.tolist"]),
        ("torch.nonzero(m)", ["torch.nonzero"]),
        ("t.masked_select(m)", ["Tensor.masked_select"]),
        ("torch.unique(i)", ["torch.unique"]),
        ("torch.repeat_interleave(t, i)", ["torch.repeat_interleave"]),
        ("torch.repeat_interleave(t, i, output_size=6)", []),
        ("torch.where(m)", ["torch.where"]),
        ("torch.where(m, t, t)", []),
        ("t[1:3]", []),
        ("t[m]", ["Tensor.__getitem__"]),
        ("t.sum() * 2", []),
    ],
)
def test_sync_classification(code, expected):
    model = torch.nn.Linear(1, 1)
    t = torch.arange(4.0)
    m = t > 1
    i = torch.tensor([1, 2, 1, 2])

    def step():
        eval(code, {"torch": torch}, {"t": t, "m": m, "i": i})  # noqa: S307 - inputs above

    from levers import Workload

    capture = capture_step(Workload(model=model, step=step), warmup=0, timed=0)
    assert [c.name for c in capture.calls if c.kind == "sync"] == expected


def test_checkpoint_recompute_flagged():
    plain = capture_step(fixture_models.net(checkpointing=False), warmup=1, timed=0)
    ckpt = capture_step(fixture_models.net(checkpointing=True), warmup=1, timed=0)
    assert not any(op.recompute for op in plain.ops)
    recomputed = [op for op in ckpt.ops if op.recompute]
    assert recomputed and all(op.phase == "backward" for op in recomputed)
    # the recomputed forward is the blocks' forward once more: same matmuls, same modules
    fwd_addmm = [op.module for op in ckpt.ops if op.phase == "forward" and "addmm" in op.name]
    re_addmm = [op.module for op in recomputed if "addmm" in op.name]
    assert sorted(re_addmm) == sorted(m for m in fwd_addmm if m.startswith("blocks"))
    assert ckpt.settings["activation_checkpointing"] is True
    assert plain.settings["activation_checkpointing"] is False


def test_tracked_memory_of_known_allocations():
    capture = capture_step(fixture_models.allocations(), warmup=0, timed=0)
    mib = 1 << 20
    assert capture.memory.source == "tracked-storages"
    assert capture.memory.start_bytes == 0
    assert capture.memory.peak_bytes == 2 * mib
    assert capture.memory.end_bytes == 0
    assert [op.live_bytes for op in capture.ops] == [mib, 2 * mib]
    assert capture.memory.peak_op == 1


def test_start_memory_counts_params_grads_and_optimizer_state():
    workload = fixture_models.linear()
    capture = capture_step(workload, warmup=1, timed=0)
    # 15 parameters of float32; SGD without momentum keeps no state; grads were set to None
    assert capture.memory.start_bytes == 15 * 4


def test_step_error_carries_the_user_traceback(mark_line):
    with pytest.raises(StepError) as info:
        capture_step(fixture_models.raising(), warmup=0, timed=0)
    message = str(info.value)
    assert "boom in the step" in message and "raising" in message
    trace = info.value.user_traceback
    assert f"fixture_models.py\", line {mark_line('raise')}" in trace
    assert "levers/capture" not in trace


def test_a_step_that_runs_out_of_memory_is_told_how_to_find_the_batch_that_fits():
    from levers import Workload
    from levers.capture.step import run_step_or_error

    model = torch.nn.Linear(4, 4)

    def step():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 16.00 GiB. GPU 0 has "
                                     "a total capacity of 79.18 GiB of which 272.19 MiB is free.")

    workload = Workload(model=model, step=step, name="big", params={"batch_size": 8})
    with pytest.raises(StepError) as info:
        run_step_or_error(workload)
    message = str(info.value)
    assert "ran out of the GPU's memory at its parameters (batch_size=8)" in message
    assert "Tried to allocate 16.00 GiB" in message and "total capacity" not in message
    assert "--fit" in message and "fix the step" not in message


def test_negative_counts_rejected():
    with pytest.raises(ValueError, match="warmup and timed must be >= 0"):
        capture_step(fixture_models.linear(), warmup=-1)


def test_capture_round_trips_through_json(net_capture):
    data = json.loads(json.dumps(net_capture.to_dict()))
    assert Capture.from_dict(data) == net_capture


def test_unknown_schema_version_refused(net_capture):
    data = net_capture.to_dict()
    data["schema_version"] = 999
    with pytest.raises(ValueError, match="re-capture"):
        Capture.from_dict(data)


def test_timing_and_environment(net_capture):
    assert len(net_capture.timing.step_s) == 1 and net_capture.timing.median_s > 0
    assert net_capture.timing.captured_step_s > 0
    assert net_capture.env["torch"] == torch.__version__
    assert net_capture.env["device"] == "cpu"
    assert net_capture.provenance["device_time"] == "unavailable"
    assert net_capture.settings["optimizer"]["class"] == "AdamW"


def test_gqa_attention_kernels_counted_without_the_registry():
    from levers.capture.ops import op_flops

    aten = torch.ops.aten
    q, k = torch.empty(2, 8, 5, 16, device="meta"), torch.empty(2, 2, 7, 16, device="meta")
    expected = 2 * 2 * 8 * 5 * 7 * (16 + 16)
    fwd = aten._scaled_dot_product_efficient_attention.default
    assert op_flops(fwd, (q, k, k, None, True), {}, None) == expected
    grad = torch.empty(2, 8, 5, 16, device="meta")
    bwd = aten._scaled_dot_product_flash_attention_backward.default
    assert op_flops(bwd, (grad, q, k, k), {}, None) == 2 * expected


def test_recording_failure_is_not_blamed_on_the_step(monkeypatch):
    from levers.capture import recorder
    from levers.capture.recorder import CaptureInternalError

    def broken(*args, **kwargs):
        raise ZeroDivisionError("bookkeeping bug")

    monkeypatch.setattr(recorder, "op_flops", broken)
    with pytest.raises(CaptureInternalError, match="could not record"):
        capture_step(fixture_models.linear(), warmup=0, timed=0)


def test_installed_libraries_are_user_code_and_the_stdlib_is_not():
    import json as stdlib_module
    import os

    import rich

    from levers.capture.source import is_user_file

    assert is_user_file(rich.__file__)  # a library in site-packages, even inside a venv
    assert not is_user_file(stdlib_module.__file__)
    assert not is_user_file(torch.__file__)
    assert not is_user_file(os.path.join(os.path.dirname(torch.__file__), "nn", "functional.py"))


def test_autocast_state_recorded():
    model = torch.nn.Linear(8, 8)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(torch.randn(2, 8)).float().sum().backward()

    from levers import Workload

    capture = capture_step(Workload(model=model, step=step), warmup=0, timed=0)
    assert capture.settings["autocast"] == ["cpu:bfloat16"]
    plain = capture_step(fixture_models.linear(), warmup=0, timed=0)
    assert plain.settings["autocast"] == []


def test_autocast_around_a_loss_outside_any_module_is_recorded():
    model = torch.nn.Linear(8, 4)
    target = torch.tensor([0, 3])

    def step():
        logits = model(torch.randn(2, 8))  # the module runs without autocast
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(logits, target)
        loss.float().backward()

    from levers import Workload

    capture = capture_step(Workload(model=model, step=step), warmup=0, timed=0)
    assert capture.settings["autocast"] == ["cpu:bfloat16"]
