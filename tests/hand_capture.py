"""Hand-built captures with known figures, so the report's numbers can be checked exactly.

The ``capture`` and ``build_capture`` fixtures are made available to every test by tests/conftest.py.
"""

from __future__ import annotations

import dataclasses

import pytest

from levers.capture.records import (
    SCHEMA_VERSION,
    CallRecord,
    Capture,
    MemoryStats,
    OpRecord,
    SourceLoc,
    StepTiming,
    TensorMeta,
)

TRAIN = "/home/me/proj/train.py"
MODEL = "/home/me/proj/model.py"


def src(file: str, line: int, code: str) -> SourceLoc:
    return SourceLoc(file=file, line=line, function="f", code=code)


def op(
    index, name, phase, module, source, flops, read_bytes, write_bytes, wall_us=1.0, device_us=None
):
    meta = TensorMeta(shape=(2, 3), dtype="float32", device="cpu")
    return OpRecord(
        index=index,
        name=name,
        phase=phase,
        module=module,
        source=source,
        inputs=(meta,),
        outputs=(meta,),
        read_bytes=read_bytes,
        write_bytes=write_bytes,
        flops=flops,
        wall_us=wall_us,
        device_us=device_us,
    )


def call(index, kind, name, source, args=None):
    return CallRecord(
        index=index,
        kind=kind,
        name=name,
        phase="forward",
        module=None,
        source=source,
        args=args or {},
        first_op=None,
        last_op=None,
    )


MM = src(MODEL, 10, "y = x @ self.w")
ACT = src(MODEL, 11, "y = torch.relu(y)")
LOSS = src(TRAIN, 20, "loss = F.cross_entropy(logits, labels)")
SYNC_A = src(TRAIN, 30, "n = int(mask.sum())")
SYNC_B = src(TRAIN, 31, "if bad.any():")


def make_ops(device: bool = False):
    """Six ops; totals: 3110 FLOPs, read 450 + written 244 bytes, wall 21 us."""
    d = (lambda us: us) if device else (lambda us: None)
    return (
        op(0, "aten.mm.default", "forward", "enc.fc", MM, 1000, 100, 50, 5.0, d(10.0)),
        op(1, "aten.relu.default", "forward", "enc", ACT, 0, 50, 50, 2.0, d(2.0)),
        op(2, "aten.nll_loss_forward.default", "forward", None, LOSS, 10, 20, 4, 3.0, d(1.0)),
        op(3, "aten.mm.default", "backward", "enc.fc", MM, 2000, 200, 100, 8.0, d(20.0)),
        op(4, "aten.add_.Tensor", "optimizer", "enc.fc", None, 100, 80, 40, 2.0, d(4.0)),
        op(5, "aten.view.default", "forward", "", ACT, 0, 0, 0, 1.0, d(0.5)),
    )


def make_calls():
    return (
        call(0, "sdpa", "scaled_dot_product_attention", MM, {"backend_ran": "math"}),
        call(1, "sdpa", "scaled_dot_product_attention", MM, {"backend_ran": "math"}),
        call(2, "sdpa", "scaled_dot_product_attention", MM, {"backend_ran": "flash"}),
        call(3, "loss", "cross_entropy", LOSS, {"ignore_index": -100, "ignored_fraction": 0.25}),
        call(4, "sync", "item", SYNC_A),
        call(5, "sync", "Tensor.__int__", SYNC_A),
        call(6, "sync", "item", SYNC_A),
        call(7, "sync", "Tensor.__bool__", SYNC_B, {"caller_in_torch": True}),
        call(8, "memory_metric", "max_memory_allocated", LOSS),
    )


def make_capture(**overrides) -> Capture:
    capture = Capture(
        schema_version=SCHEMA_VERSION,
        workload="tiny",
        workload_params={"size": "tiny", "batch_size": 4},
        tokens_per_step=512,
        env={"torch": "2.13.0", "python": "3.11.7", "device": "cpu", "device_name": "cpu"},
        provenance={
            "flops": "counted",
            "bytes": "counted",
            "wall_time": "measured",
            "memory": "tracked",
        },
        timing=StepTiming(step_s=(0.030, 0.010, 0.020, 0.050), captured_step_s=0.100),
        memory=MemoryStats(
            source="tracked-storages", start_bytes=1 << 20, peak_bytes=3 << 20, end_bytes=1 << 20
        ),
        ops=make_ops(),
        calls=make_calls(),
        modules={"": "Net", "enc": "Encoder", "enc.fc": "Linear"},
    )
    return dataclasses.replace(capture, **overrides)


@pytest.fixture
def capture() -> Capture:
    return make_capture()


@pytest.fixture
def build_capture():
    """``build_capture(**overrides)``: the fixture capture with some fields replaced."""
    return make_capture
