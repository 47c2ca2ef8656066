"""The collectives of a captured step: c10d ops, and which of them are DDP gradient buckets.

torch.distributed's collectives dispatch as ops of the ``c10d`` namespace
(``c10d.allreduce_.default``, ``c10d._allgather_base_.default``, ...) or, for functional
collectives, ``_c10d_functional``; the capture records them as ops with their tensors' shapes.

A DDP bucket is one all-reduce of a single flat floating-point tensor in backward: its bytes
are the bucket's size. DDP's integer all-reduce of the used-parameter map (under
``find_unused_parameters=True``) is a collective but not a bucket.
"""

from __future__ import annotations

from collections.abc import Iterable

from levers.capture.records import Capture, OpRecord, TensorMeta

COLLECTIVE_PREFIXES = ("c10d.", "_c10d_functional.", "c10d_functional.")
FLOAT_DTYPES = ("float32", "bfloat16", "float16", "float64")
ELEMENT_BYTES = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
}


def is_collective(op: OpRecord) -> bool:
    return op.name.startswith(COLLECTIVE_PREFIXES)


def collective_name(op: OpRecord) -> str:
    """``c10d.allreduce_.default`` -> ``allreduce``; ``c10d._allgather_base_`` -> ``allgather_base``."""
    base = op.name.split(".")[1] if "." in op.name else op.name
    return base.strip("_")


def tensor_bytes(meta: TensorMeta) -> int:
    return meta.numel * ELEMENT_BYTES.get(meta.dtype, 4)


def op_bytes(op: OpRecord) -> int:
    """Bytes of the op's tensor inputs (for an all-reduce: the buffer it reduces)."""
    return sum(tensor_bytes(m) for m in op.inputs)


def is_bucket(op: OpRecord) -> bool:
    """A DDP gradient bucket: one flat floating-point all-reduce in backward."""
    return (
        collective_name(op) == "allreduce"
        and op.phase == "backward"
        and len(op.inputs) == 1
        and len(op.inputs[0].shape) == 1
        and op.inputs[0].dtype in FLOAT_DTYPES
    )


def collectives(capture: Capture) -> list[OpRecord]:
    return [op for op in capture.ops if is_collective(op)]


def buckets(ops: Iterable[OpRecord]) -> list[OpRecord]:
    return [op for op in ops if is_bucket(op)]
