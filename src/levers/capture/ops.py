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

import warnings
from typing import Any

import torch
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
    """Tensors in an op's arguments or result, in order (aten values nest tuples, lists, dicts).

    A hand-written walk rather than pytree's: it runs for every op of the step.
    """
    found: list[torch.Tensor] = []
    stack = [tree]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (tuple, list)):
            stack.extend(reversed(x))
        elif isinstance(x, dict):
            stack.extend(reversed(list(x.values())))
    return found


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


# attention kernels taking (query, key, value, ...) as [batch, heads, seq, head_dim]; ours rather
# than the registry's so grouped-query shapes (fewer key/value heads) count on every torch version
_SDPA_FORWARD = {
    _aten._scaled_dot_product_flash_attention_for_cpu,
    _aten._scaled_dot_product_flash_attention,
    _aten._scaled_dot_product_efficient_attention,
    _aten._scaled_dot_product_cudnn_attention,
}
# their backward kernels take (grad_out, query, key, value, ...)
_SDPA_BACKWARD = {
    _aten._scaled_dot_product_flash_attention_for_cpu_backward,
    _aten._scaled_dot_product_flash_attention_backward,
    _aten._scaled_dot_product_efficient_attention_backward,
    _aten._scaled_dot_product_cudnn_attention_backward,
}


def sdpa_forward_flops(query_shape, key_shape, value_shape) -> int:
    """FLOPs of q @ k^T and softmax(scores) @ v, as PyTorch's registry counts them."""
    b, h_q, s_q, d_q = query_shape
    s_k, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h_q * s_q * s_k * (d_q + d_v)


def op_flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one op by PyTorch's registry; 0 for ops it has no formula for."""
    packet = func._overloadpacket
    if packet in _SDPA_FORWARD:
        return sdpa_forward_flops(*(t.shape for t in args[:3]))
    if packet in _SDPA_BACKWARD:
        # four batched matmuls, twice the forward's work
        return 2 * sdpa_forward_flops(*(t.shape for t in args[1:4]))
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except Exception as exc:  # a formula that rejects shapes must not fail the user's step
        _warn_once(packet, exc)
        return 0


_warned: set[Any] = set()


def _warn_once(packet: Any, exc: Exception) -> None:
    if packet not in _warned:
        _warned.add(packet)
        warnings.warn(f"levers: no FLOP count for {packet} ({exc}); counted as 0", stacklevel=3)
