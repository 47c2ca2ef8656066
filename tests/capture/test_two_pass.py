"""The two-pass capture: the timed step runs under the profiler alone, its op events align with
the recorded ops, kernels are joined through the alignment, and the fallback says why."""

from __future__ import annotations

import importlib

import pytest
import torch
from torch.nn.modules.module import _global_forward_pre_hooks
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import _get_current_dispatch_mode

import fixture_models
from levers.capture import capture_step, gpu
from levers.capture.align import Alignment, align, kernel_ops, op_name_key
from levers.capture.json_io import read_capture, write_capture
from levers.capture.records import Capture, MemoryStats, peak_op
from levers.capture.step import capture_mode
from levers.capture.timed import MIN_COVERAGE, TimedStep, join_passes, timed_ops
from levers.workload import Workload


def _observed_steps(workload: Workload) -> list[dict[str, bool]]:
    """Wrap the workload's step: for each call, what observed it."""
    seen: list[dict[str, bool]] = []
    step = workload.step

    def observed() -> object:
        seen.append({
            "dispatch_mode": _get_current_dispatch_mode() is not None,
            "function_mode": torch._C._is_torch_function_mode_enabled(),
            "module_hooks": bool(_global_forward_pre_hooks),
            "profiler": torch.autograd.profiler._is_profiler_enabled,
        })
        return step()

    workload.step = observed
    return seen


def test_the_timed_step_runs_under_the_profiler_alone():
    workload = fixture_models.net()
    seen = _observed_steps(workload)
    capture = capture_step(workload, warmup=1, timed=2, mode="two-pass")
    assert len(seen) == 5  # warm-up, two timed plain steps, the recorded step, the timed step
    recorded, timed = seen[3], seen[4]
    assert recorded["dispatch_mode"] and recorded["function_mode"] and recorded["module_hooks"]
    assert timed == {
        "dispatch_mode": False, "function_mode": False, "module_hooks": False, "profiler": True,
    }
    assert capture.passes.mode == "two-pass"
    assert capture.timing.captured_step_s != capture.passes.content_step_s


def test_the_one_pass_mode_records_and_times_one_step(monkeypatch):
    monkeypatch.setenv("LEVERS_CAPTURE", "one-pass")
    workload = fixture_models.net()
    seen = _observed_steps(workload)
    capture = capture_step(workload, warmup=1, timed=0)
    assert len(seen) == 2 and seen[1]["dispatch_mode"]
    assert capture.passes.mode == "one-pass"
    assert capture.passes.reason == "the one-pass mode was asked for"
    assert capture.passes.coverage is None


def test_capture_mode_reads_the_parameter_then_the_environment(monkeypatch):
    monkeypatch.delenv("LEVERS_CAPTURE", raising=False)
    assert capture_mode() == "two-pass"
    monkeypatch.setenv("LEVERS_CAPTURE", "one-pass")
    assert capture_mode() == "one-pass"
    assert capture_mode("two-pass") == "two-pass"
    monkeypatch.setenv("LEVERS_CAPTURE", "three-pass")
    with pytest.raises(ValueError, match="LEVERS_CAPTURE='three-pass' is not a capture mode"):
        capture_mode()


def _same_but_timing(one: Capture, two: Capture) -> None:
    """Everything the rules read is the recorded step's in both modes (CPU: no kernels)."""
    fields = ("name", "phase", "module", "source", "inputs", "outputs", "flops", "read_bytes",
              "write_bytes", "live_bytes", "forward_op", "autograd_node", "recompute")
    for a, b in zip(one.ops, two.ops, strict=True):
        assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    assert [(c.kind, c.name, c.first_op, c.last_op, c.args) for c in one.calls] == [
        (c.kind, c.name, c.first_op, c.last_op, c.args) for c in two.calls
    ]
    assert one.memory == two.memory


@pytest.mark.parametrize(
    "name, params",
    [("demo", {}), ("llama", {}), ("hf", {"arch": "llama", "attn": "sdpa", "size": "tiny"})],
)
def test_the_timed_pass_aligns_with_the_recorded_step(name, params):
    if name == "hf":
        pytest.importorskip("transformers")
    module = importlib.import_module(f"levers.workloads.{name}")
    one = capture_step(module.build(**params), warmup=1, timed=0, mode="one-pass")
    two = capture_step(module.build(**params), warmup=1, timed=0, mode="two-pass")
    assert two.passes.mode == "two-pass" and two.passes.reason is None
    assert two.passes.coverage >= 0.9
    assert two.passes.coverage == two.passes.num_aligned_ops / len(two.ops)
    # the recorded step is the same step in both modes (the second capture's model was built
    # from the same seed and stepped as often before it)
    _same_but_timing(one, two)


def test_an_alternating_step_falls_back_to_one_pass_and_says_why():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = [0]

    def step() -> None:
        calls[0] += 1
        x = torch.randn(4, 8)
        if calls[0] % 2:  # every other step runs other ops
            loss = model(x).sum()
        else:
            loss = sum((x * i).exp().mean() for i in range(6)) + model[0](x).relu().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    capture = capture_step(Workload(model=model, step=step, optimizer=opt, name="alt"),
                           warmup=0, timed=0, mode="two-pass")
    passes = capture.passes
    assert passes.mode == "one-pass"
    assert passes.coverage < MIN_COVERAGE
    assert passes.reason.startswith(f"the timed step's ops aligned with {passes.coverage:.0%} ")
    assert capture.timing.captured_step_s == passes.content_step_s  # the recorded step's time


def test_known_stream_differences_align():
    content = [
        ("aten.mm.default", ((4, 8), (8, 8))),
        ("aten.view.default", ((4, 8),)),  # reshape under the recorder
        ("aten.detach.default", ((8,),)),  # the recorder's own
        ("aten.add.Tensor", ((8,), (8,))),  # out-of-place gradient accumulation
        ("aten.mul.Tensor", ((4, 8),)),  # times a Python number
        ("aten.sum.default", ((4, 8),)),
        ("aten.relu.default", ((3, 8),)),  # the next step's batch is 5, not 3
        ("aten.exp.default", ((3, 8),)),
    ]
    timed = [
        ("aten::mm", ((4, 8), (8, 8))),
        ("aten::_reshape_alias", ((4, 8),)),
        ("aten::add_", ((8,), (8,))),
        ("aten::mul", ((4, 8), ())),
        ("aten::sum", ((4, 8),)),
        ("aten::relu", ((5, 8),)),
        ("aten::exp", ((5, 8),)),
    ]
    alignment = align(content, timed)
    assert alignment.content_of_timed == (0, 1, 3, 4, 5, 6, 7)
    assert alignment.num_aligned == 7
    assert op_name_key("aten.add_.Tensor") == op_name_key("aten::add") == "add"


class _AddmmLayer(torch.nn.Module):
    """GPT-2's Conv1D in small: ``torch.addmm`` called directly, so under autocast the casts of
    its inputs run inside the ``aten::addmm`` profiler event."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(16, 16))
        self.bias = torch.nn.Parameter(torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x, self.weight)


def test_autocast_casts_inside_an_op_event_align_with_the_recorded_casts():
    torch.manual_seed(0)
    model = torch.nn.Sequential(_AddmmLayer(), torch.nn.ReLU(), _AddmmLayer())
    optimizer = torch.optim.AdamW(model.parameters(), foreach=True)
    x = torch.randn(8, 16)

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        loss.backward()
        optimizer.step()  # foreach AdamW: casts inside its ops that are no autocast's
        optimizer.zero_grad(set_to_none=True)
        return loss

    capture = capture_step(Workload(model=model, step=step, optimizer=optimizer),
                           warmup=1, timed=1, mode="two-pass")
    casts = [op for op in capture.ops if op.name == "aten._to_copy.default"]
    assert len(casts) >= 4  # the inputs of both addmm calls, cast to bf16
    # the ops left unaligned are at most the recorder's own detach calls: not the casts
    unaligned = len(capture.ops) - capture.passes.num_aligned_ops
    assert unaligned <= sum(op.name == "aten.detach.default" for op in capture.ops)


def test_a_step_whose_batch_changes_still_aligns():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [4, 6, 4]  # warm-up, the recorded step, the timed step

    def step() -> None:
        loss = model(torch.randn(batches.pop(0), 8)).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()

    capture = capture_step(Workload(model=model, step=step, optimizer=opt, name="dyn"),
                           warmup=1, timed=0, mode="two-pass")
    assert capture.passes.mode == "two-pass" and capture.passes.coverage >= 0.9
    first_linear = next(op for op in capture.ops if op.name == "aten.addmm.default")
    assert first_linear.inputs[1].shape == (6, 8)  # the recorded step's batch


def test_kernels_join_through_the_alignment():
    # timed op events 0..4; event 2 did not align, content op 1 is a view
    alignment = Alignment(content_of_timed=(0, 1, None, 3, None))
    is_view = [False, True, False, False]
    launched_by = [0, 2, 2, 3, None, 4, 0]  # the op event that launched each kernel
    ops, num_to_neighbour = kernel_ops(launched_by, alignment, is_view, [False] * 5)
    # event 2's kernels go to the nearest aligned op before it that is not a view: op 0
    assert ops == [0, 0, 0, 3, None, 3, 0]
    assert num_to_neighbour == 3
    # an unaligned collective's kernels stay with the step
    collective = [False, False, True, False, False]
    assert kernel_ops(launched_by, alignment, is_view, collective) == (
        [0, None, None, 3, None, 3, 0], 1
    )
    events = [gpu.DeviceEvent(f"k{i}", 1000 * i, 1000 * i + 500 * (i + 1), i)
              for i in range(len(launched_by))]
    device_us, kernels = gpu.kernel_records(events, ops)
    assert [k.op_index for k in kernels] == ops
    assert [k.start_us for k in kernels] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert device_us == {0: 0.5 + 1.0 + 1.5 + 3.5, 3: 2.0 + 3.0}
    # every kernel's time is kept: the ops' and the unjoined ones' add up to all of it
    assert sum(device_us.values()) + kernels[4].device_us == sum(k.device_us for k in kernels)


def test_the_device_join_on_a_cpu_profile_with_planted_kernels():
    """join_passes as on a GPU, over a real CPU profile: one planted kernel per timed op event
    (named by the event's own correlation id) and one launched outside every op."""
    workload = fixture_models.linear()
    workload.step()
    content = capture_step(workload, warmup=0, timed=0, ran_before=True, mode="one-pass")
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 profile_memory=True) as prof:
        workload.step()
    ops = timed_ops(prof, kernels=True)
    own_id: dict[int, int] = {}  # position -> the event's own correlation id (the smallest)
    for correlation_id, position in ops.op_of_correlation.items():
        own_id[position] = min(correlation_id, own_id.get(position, correlation_id))
    planted = [gpu.DeviceEvent(f"k{p}", 1000 * p, 1000 * p + 10 * (p + 1), own_id[p])
               for p in range(len(ops.ops))]
    planted.append(gpu.DeviceEvent("outside", 10**7, 10**7 + 5, 0))
    memory = MemoryStats(source="cuda-allocator", start_bytes=100, peak_bytes=10**6,
                         end_bytes=100)
    timed = TimedStep(device=torch.device("cpu"), step_s=0.001, ops=ops,
                      device_events=tuple(planted), profiler=prof, memory=memory)
    joined = join_passes(content, timed)
    alignment = align([(op.name, tuple(m.shape for m in op.inputs)) for op in content.ops],
                      [(e.name, e.input_shapes) for e in ops.ops])
    assert joined.passes.mode == "two-pass" and joined.passes.num_kernels_to_neighbour == 0
    assert joined.timing.captured_step_s == 0.001
    assert [k.name for k in joined.kernels] == [k.name for k in planted]
    assert joined.kernels[-1].op_index is None
    expected = {index: (10 * (p + 1)) / 1000.0
                for p, index in enumerate(alignment.content_of_timed) if index is not None}
    assert len(expected) >= 0.9 * len(content.ops)
    assert {op.index: op.device_us for op in joined.ops if op.device_us} == expected
    assert all(op.live_bytes is not None for op in joined.ops)
    assert joined.memory.peak_op == peak_op(joined.ops)
    assert joined.memory.start_bytes == 100 and joined.memory.source == "cuda-allocator"


def test_an_unaligned_event_before_every_aligned_op_joins_the_next_one():
    ops, num_to_neighbour = kernel_ops(
        [0, 1], Alignment(content_of_timed=(None, 0)), [False], [False, False]
    )
    assert ops == [0, 0] and num_to_neighbour == 1


def test_passes_round_trip_through_json(tmp_path):
    capture = capture_step(fixture_models.linear(), warmup=1, timed=0, mode="two-pass")
    path = tmp_path / "capture.json"
    write_capture(capture, path)
    assert read_capture(path).passes == capture.passes
    data = capture.to_dict()
    del data["passes"]  # written by a levers from before the field
    assert Capture.from_dict(data).passes is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_come_from_the_timed_pass():
    capture = capture_step(fixture_models.net(device="cuda"), warmup=1, timed=2, mode="two-pass")
    passes = capture.passes
    # on the H200 the coverage of this net is 0.89 (torch 2.11): its forward's transposes are
    # as_strided events in the timed pass; views launch no kernel, so the join below holds
    assert passes.mode == "two-pass" and passes.coverage >= 0.8
    joined = [k for k in capture.kernels if k.op_index is not None]
    assert joined and len(joined) >= 0.9 * len(capture.kernels)
    per_op: dict[int, float] = {}
    for k in joined:
        per_op[k.op_index] = per_op.get(k.op_index, 0.0) + k.device_us
    for op in capture.ops:
        assert op.device_us == pytest.approx(per_op.get(op.index, 0.0))
    assert capture.memory.source == "cuda-allocator"
    assert capture.memory.peak_bytes >= max(op.live_bytes for op in capture.ops)
