"""The capture on a CUDA GPU: kernels joined to ops, allocator memory, non-intrusion."""

from __future__ import annotations

import pytest
import torch

import fixture_models
from levers.capture import capture_step
from test_non_intrusion import assert_capture_does_not_change_training

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def gpu_capture():
    return capture_step(fixture_models.net(device="cuda"), warmup=1, timed=2)


def test_kernels_joined_to_ops(gpu_capture):
    ops = gpu_capture.ops
    matmuls = [op for op in ops if op.name in ("aten.addmm.default", "aten.mm.default")]
    assert matmuls and all(op.device_us > 0 for op in matmuls)
    views = [op for op in ops if op.is_view]
    assert views and all(op.device_us == 0 for op in views)
    joined = [k for k in gpu_capture.kernels if k.op_index is not None]
    assert joined
    per_op = {}
    for k in joined:
        per_op[k.op_index] = per_op.get(k.op_index, 0.0) + k.device_us
    for index, dur in per_op.items():
        assert ops[index].device_us == pytest.approx(dur)
    assert gpu_capture.provenance["device_time"] == "measured"


def test_sdpa_backend_on_gpu(gpu_capture):
    sdpa = [c for c in gpu_capture.calls if c.kind == "sdpa"]
    # pinned to FLASH and MATH with a dense mask: flash cannot take a mask, so MATH runs
    assert [c.args["backend_ran"] for c in sdpa] == ["MATH", "MATH"]


def test_allocator_memory(gpu_capture):
    mem = gpu_capture.memory
    assert mem.source == "cuda-allocator"
    assert mem.peak_bytes >= max(op.live_bytes for op in gpu_capture.ops)
    assert mem.peak_reserved_bytes >= mem.peak_bytes >= mem.start_bytes > 0
    assert gpu_capture.env["device_name"] == torch.cuda.get_device_name()


def test_gpu_capture_does_not_change_training():
    assert_capture_does_not_change_training(lambda: fixture_models.net(device="cuda"))


def test_kernel_join_attributes_every_kernel_once():
    from levers.capture import gpu

    marker = gpu.range_marker()
    x = torch.randn(256, 256, device="cuda", requires_grad=True)
    with gpu.kernel_profiler() as prof:
        for i in range(4):
            with marker(i):
                y = (x @ x).relu()
        y.sum().backward()  # kernels from the autograd thread, outside any range
        torch.cuda.synchronize()
    per_op, kernels = gpu.join_kernels(prof)
    assert sorted(per_op) == [0, 1, 2, 3]
    assert not [k.name for k in kernels if k.name.startswith("levers#")]
    # every kernel counted once: the joined and unjoined kernels add up to the device timeline
    assert sum(k.device_us for k in kernels) == pytest.approx(gpu.summed_kernel_us(prof))
    assert sum(per_op.values()) == pytest.approx(
        sum(k.device_us for k in kernels if k.op_index is not None)
    )
    for index in range(4):  # a matmul and a relu, at least two kernels, in each range
        assert sum(1 for k in kernels if k.op_index == index) >= 2
    assert any(k.op_index is None for k in kernels)


def test_live_bytes_per_op_are_the_allocators_figure_after_the_op():
    from levers import Workload

    reads = []

    def step():
        a = torch.empty(2**20, device="cuda")
        reads.append(torch.cuda.memory_allocated())
        b = torch.empty(2**19, device="cuda")
        reads.append(torch.cuda.memory_allocated())
        del a
        c = torch.empty(2**18, device="cuda")
        reads.append(torch.cuda.memory_allocated())
        del b, c

    workload = Workload(model=torch.nn.Linear(2, 2, device="cuda"), step=step)
    capture = capture_step(workload, warmup=0, timed=0)
    assert [op.name for op in capture.ops] == ["aten.empty.memory_format"] * 3
    # the bytes come from the last step the capture ran: the timed pass of a two-pass capture
    # (the step ran twice), the one step of a one-pass capture
    reads = reads[-3:]
    assert [op.live_bytes for op in capture.ops] == reads
    assert reads[1] - reads[0] == 2**19 * 4 and reads[2] - reads[1] == 2**18 * 4 - 2**20 * 4
    assert capture.memory.peak_op == 1
