"""Roofline time of kernels on a GPU: FLOPs against the tensor-core peak, bytes against HBM.

    time(part) = max(flops / (peak(dtype) * MATMUL_EFFICIENCY),
                     bytes / (bandwidth * BANDWIDTH_EFFICIENCY))
                 + num_kernels * KERNEL_OVERHEAD_US

The efficiencies are what well-tuned kernels reach in practice (large GEMMs reach about 70% of
the dense peak, streaming kernels about 80% of HBM bandwidth); the per-kernel overhead is the
launch and ramp time of a short kernel, which dominates chains of small elementwise kernels.
All three are coarse: an estimate says which way and roughly how far, a GPU measures.
"""

from __future__ import annotations

from collections.abc import Iterable

from levers.capture.records import OpRecord
from levers.hardware import GpuSpec
from levers.audit.finding import Part

MATMUL_EFFICIENCY = 0.7
BANDWIDTH_EFFICIENCY = 0.8
KERNEL_OVERHEAD_US = 2.0


def part_us(part: Part, gpu: GpuSpec) -> float:
    compute_s = 0.0
    if part.flops:
        compute_s = part.flops / (
            gpu.peak_flops(part.dtype, tf32=part.tf32) * MATMUL_EFFICIENCY
        )
    memory_s = part.bytes / (gpu.bandwidth_bytes_per_s * BANDWIDTH_EFFICIENCY)
    return max(compute_s, memory_s) * 1e6 + part.num_kernels * KERNEL_OVERHEAD_US


def parts_us(parts: Iterable[Part], gpu: GpuSpec) -> float:
    return sum(part_us(p, gpu) for p in parts)


def op_part(op: OpRecord, *, assumed_dtype: str | None, tf32: bool) -> Part:
    """An op of the capture as a Part on the target GPU.

    Views move nothing and launch nothing. On a CPU capture that ran in float32 with a
    low-precision ``assumed_dtype``, floating-point tensors are assumed to be that dtype on the
    GPU: their bytes scale by the size ratio and matmul FLOPs run at that dtype's peak.
    """
    if op.is_view:
        return Part(label=op.name, num_kernels=0)
    dtype = (
        op.inputs[0].dtype if op.inputs else (op.outputs[0].dtype if op.outputs else "")
    )
    num_bytes = op.read_bytes + op.write_bytes
    if assumed_dtype is not None:
        num_bytes = _rescaled_bytes(op, assumed_dtype)
        if dtype == "float32":
            dtype = assumed_dtype
    return Part(
        label=op.name,
        flops=op.flops,
        bytes=num_bytes,
        num_kernels=1,
        dtype=dtype if op.flops else "",
        tf32=tf32,
    )


_SIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}


def _rescaled_bytes(op: OpRecord, assumed_dtype: str) -> int:
    ratio = _SIZES[assumed_dtype] / 4
    total = 0.0
    for metas, counted in ((op.inputs, op.read_bytes), (op.outputs, op.write_bytes)):
        if not counted:
            continue
        for m in metas:
            size = _SIZES.get(m.dtype, 0)
            if m.dtype == "float32":
                total += m.numel * 4 * ratio
            elif size:
                total += m.numel * size
            else:
                total += m.numel * (
                    1 if m.dtype == "bool" else 8 if m.dtype == "int64" else 4
                )
    return int(total)


def ops_us(
    ops: Iterable[OpRecord], gpu: GpuSpec, *, assumed_dtype: str | None, tf32: bool
) -> float:
    return sum(
        part_us(op_part(op, assumed_dtype=assumed_dtype, tf32=tf32), gpu) for op in ops
    )


def dtype_size(dtype: str) -> int:
    return _SIZES.get(dtype, 4)
