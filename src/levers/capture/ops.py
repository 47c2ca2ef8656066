"""What one aten op reads, writes and computes: tensor metas, bytes and FLOPs.

FLOPs come from PyTorch's own registry (``torch.utils.flop_counter``, the one ``FlopCounterMode``
uses), so a capture's totals equal ``FlopCounterMode``'s for the same step. The CPU flash
attention kernel, which that registry does not cover, is counted with the same formula the
registry uses for the GPU attention kernels.

Bytes are a first-order model of memory traffic: every tensor input is read once and every
output written once; views and metadata-only ops move nothing; an in-place op writes what it
mutates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from levers.capture.records import TensorMeta

_aten = torch.ops.aten

# ops that only allocate (their output is garbage until written by a later op)
_ALLOCATING = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
}


def tensors_in(tree: Any) -> list[torch.Tensor]:
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, torch.Tensor)]


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(
        shape=tuple(int(d) for d in t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
    )


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def schema_kind(func: torch._ops.OpOverload) -> tuple[bool, bool]:
    """(is_view, is_inplace) from the op's alias annotations."""
    schema = func._schema
    is_view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
    is_inplace = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    return is_view, is_inplace


def traffic_bytes(
    func: torch._ops.OpOverload,
    inputs: list[torch.Tensor],
    outputs: list[torch.Tensor],
    is_view: bool,
) -> tuple[int, int]:
    """(read_bytes, write_bytes) of one op."""
    if is_view:
        return 0, 0
    read = sum(nbytes(t) for t in inputs)
    write = 0 if func in _ALLOCATING else sum(nbytes(t) for t in outputs)
    return read, write


def _cpu_flash_flops(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> int:
    b, h_q, s_q, d_q = query.shape
    s_k, d_v = key.shape[-2], value.shape[-1]
    # two batched matmuls: q @ k^T and softmax(scores) @ v
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def op_flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one op by PyTorch's registry; 0 for ops it has no formula for."""
    packet = func._overloadpacket
    if packet is _aten._scaled_dot_product_flash_attention_for_cpu:
        return _cpu_flash_flops(*args[:3])
    if packet is _aten._scaled_dot_product_flash_attention_for_cpu_backward:
        # four batched matmuls, twice the forward's work
        return 2 * _cpu_flash_flops(*args[1:4])
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))
