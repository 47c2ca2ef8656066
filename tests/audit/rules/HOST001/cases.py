"""HOST001 fixtures. The rule reads GPU captures only: each case is a CPU capture made to look like
an H100's (TRANSFORM), with every op's kernel timed at 10 µs, laid end to end with an equal gap
after each, and the step's time set so that launch and idle take the share the case names. The
sync case's `.item()` reads a GPU tensor there; the MoE case holds a module named `experts`; the
dynamic-shapes case carries the recompile dynamo records when an input's size changes."""

# fmt: off
# (the cases are laid out by hand: tests find the lines marked `# mark: <case>`)

import dataclasses

import torch
from audit_helpers import relabel_as_gpu

from levers import Workload
from levers.capture.records import KernelRecord, StepTiming

KERNEL_US = 10.0


class Experts(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x):
        return self.experts[0](x) + self.experts[1](x)


def _workload(model=None, sync=False):
    torch.manual_seed(0)
    model = model or torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 8)
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step():
        x = torch.randn(4, 8)  # mark: fire_gaps fire_large_gaps fire_with_sync fire_moe fire_dynamic_shapes regress_no_kernel_starts regress_compiled
        loss = model(x).pow(2).mean()
        if sync:
            loss = loss / loss.detach().abs().item()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.detach()

    return Workload(model=model, step=step, optimizer=opt, name="host001")


def _on_gpu(gap_share, *, kernel_starts=True, compile_stats=None, replayed_share=0.0):
    """The capture as an H100's with launch and idle ``gap_share`` of the step, of which
    ``replayed_share`` of the step is a kernel no op launched (a CUDA graph's replay)."""
    def transform(capture):
        capture = relabel_as_gpu(capture)
        timed = [op.index for op in capture.ops if not op.is_view]
        ops = tuple(
            dataclasses.replace(op, device_us=0.0 if op.is_view else KERNEL_US)
            for op in capture.ops
        )
        kernel_us = KERNEL_US * len(timed)
        step_us = kernel_us / (1.0 - gap_share)
        gap_us = (step_us - kernel_us) / len(timed)
        kernels = tuple(
            KernelRecord(name=f"kernel_{i}", device_us=KERNEL_US, op_index=index,
                         start_us=i * (KERNEL_US + gap_us) if kernel_starts else None)
            for i, index in enumerate(timed)
        )
        if replayed_share:
            # after the ops' last kernel
            kernels += (KernelRecord(name="graph_replay", device_us=replayed_share * step_us,
                                     op_index=None, start_us=len(timed) * (KERNEL_US + gap_us)),)
        calls = tuple(
            dataclasses.replace(
                c, args={**c.args, "tensor": {**c.args["tensor"], "device": "cuda:0"}}
            )
            if c.kind == "sync" and c.args.get("tensor") else c
            for c in capture.calls
        )
        settings = {**capture.settings, "compile": compile_stats}
        timing = StepTiming(step_s=(step_us / 1e6,), captured_step_s=step_us / 1e6)
        return dataclasses.replace(
            capture, ops=ops, kernels=kernels, calls=calls, timing=timing, settings=settings,
        )

    return transform


COMPILED = {"frames_compiled": 2, "graph_breaks": [], "recompile_limit_hit": False,
            "recompiles": []}
RESIZED = {
    "frames_compiled": 2, "graph_breaks": [], "recompile_limit_hit": False,
    "recompiles": [{
        "function": "forward", "file": "/models/vit.py", "line": 40,
        "code": "def forward(self, x):",
        "count": 1, "reasons": ["0/0: tensor 'x' size mismatch at index 0. expected 64, actual 48"],
    }],
}

fire_gaps = _workload
fire_large_gaps = _workload
ok_below_threshold = _workload
ok_cpu_capture = _workload
ok_gpu_without_device_time = _workload
ok_graph_replay_fills_the_gaps = _workload
fire_dynamic_shapes = _workload
regress_no_kernel_starts = _workload
regress_compiled = _workload


def fire_with_sync():
    return _workload(sync=True)


def fire_moe():
    return _workload(model=Experts())


TRANSFORM = {
    "fire_gaps": _on_gpu(0.16),
    "fire_large_gaps": _on_gpu(0.40),
    "fire_with_sync": _on_gpu(0.16),
    "fire_moe": _on_gpu(0.16),
    "fire_dynamic_shapes": _on_gpu(0.16, compile_stats=RESIZED),
    "regress_no_kernel_starts": _on_gpu(0.16, kernel_starts=False),
    "regress_compiled": _on_gpu(0.16, compile_stats=COMPILED),
    "ok_below_threshold": _on_gpu(0.05),
    "ok_gpu_without_device_time": relabel_as_gpu,
    # the ops' kernels leave 16% idle, but a replayed graph's kernels run in 12% of it
    "ok_graph_replay_fills_the_gaps": _on_gpu(0.16, replayed_share=0.12),
}
