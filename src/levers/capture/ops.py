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
from typing import Any, NamedTuple

import torch
from torch.utils.flop_counter import flop_registry

from levers.capture.records import TensorMeta

_Tensor = torch.Tensor

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
    _collect(tree, found)
    return found


def tensors_in_call(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """``tensors_in((args, kwargs))``, with the flat argument lists of most aten ops walked
    without recursion."""
    found: list[torch.Tensor] = []
    for x in args:
        if isinstance(x, _Tensor):
            found.append(x)
        elif isinstance(x, (tuple, list, dict)):
            _collect(x, found)
    if kwargs:
        _collect(kwargs, found)
    return found


def _collect(x: Any, found: list[torch.Tensor]) -> None:
    if isinstance(x, _Tensor):
        found.append(x)
    elif isinstance(x, (tuple, list)):
        for item in x:
            if isinstance(item, _Tensor):
                found.append(item)
            elif isinstance(item, (tuple, list, dict)):
                _collect(item, found)
    elif isinstance(x, dict):
        for item in x.values():
            _collect(item, found)


def meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(
        shape=tuple(int(d) for d in t.shape),
        dtype=str(t.dtype).removeprefix("torch."),
        device=str(t.device),
    )


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def tensor_key(t: torch.Tensor) -> tuple:
    """(shape, dtype, device): all that ``meta_of`` and ``nbytes`` read of a tensor."""
    return (t.shape, t.dtype, t.device)


def meta_of_key(key: tuple) -> tuple[TensorMeta, int]:
    """``(meta_of(t), nbytes(t))`` from ``tensor_key(t)``."""
    shape, dtype, device = key
    numel = 1
    for d in shape:
        numel *= d
    meta = TensorMeta(
        shape=tuple(int(d) for d in shape),
        dtype=str(dtype).removeprefix("torch."),
        device=str(device),
    )
    return meta, numel * dtype.itemsize


# (shape, dtype, device) -> (TensorMeta, bytes), shared by every capture of the process (the
# warm-up capture fills it for the measured one); emptied when it grows past this many entries
_KNOWN_METAS: dict[tuple, tuple[TensorMeta, int]] = {}
_MAX_KNOWN_METAS = 200_000


class MetaCache:
    """``(meta_of(t), nbytes(t))`` of tensors, one entry per (shape, dtype, device).

    A step has few distinct tensor signatures and thousands of tensors, so each TensorMeta is
    built once (and shared: it is frozen), and kept for the next capture of the same step.
    """

    def __init__(self) -> None:
        if len(_KNOWN_METAS) > _MAX_KNOWN_METAS:
            _KNOWN_METAS.clear()
        self._known = _KNOWN_METAS

    def of(self, t: torch.Tensor) -> tuple[TensorMeta, int]:
        key = (t.shape, t.dtype, t.device)
        try:
            hit = self._known.get(key)
        except TypeError:  # symbolic sizes do not hash
            return meta_of(t), nbytes(t)
        if hit is None:
            hit = self._known[key] = (meta_of(t), nbytes(t))
        return hit

    def of_keys(self, keys: list[tuple]) -> tuple[tuple[TensorMeta, ...], int]:
        """``of_all`` of the tensors whose ``tensor_key`` are ``keys``: the recorder reads the
        keys while the op runs and resolves them after the step."""
        known = self._known
        metas = []
        total_bytes = 0
        for key in keys:
            try:
                hit = known.get(key)
            except TypeError:  # symbolic sizes do not hash
                hit = meta_of_key(key)
            if hit is None:
                hit = known[key] = meta_of_key(key)
            metas.append(hit[0])
            total_bytes += hit[1]
        return tuple(metas), total_bytes

    def of_all(self, tensors: list[torch.Tensor]) -> tuple[tuple[TensorMeta, ...], int]:
        """(the metas of ``tensors``, their summed bytes): ``of`` over a list, in one call."""
        known = self._known
        metas = []
        total_bytes = 0
        for t in tensors:
            key = (t.shape, t.dtype, t.device)
            try:
                hit = known.get(key)
            except TypeError:  # symbolic sizes do not hash
                hit = (meta_of(t), nbytes(t))
            if hit is None:
                hit = known[key] = (meta_of(t), nbytes(t))
            metas.append(hit[0])
            total_bytes += hit[1]
        return tuple(metas), total_bytes


class OpInfo(NamedTuple):
    """What an op's schema says, read once per op overload."""

    name: str  # "aten.mm.default"
    is_view: bool
    is_inplace: bool
    allocates_only: bool  # its output is garbage until written: no bytes written
    has_flops: bool  # op_flops can count it
    is_profiler: bool  # the profiler's own record_function ops: not part of the step
    # a list, tuple or dict argument may hold tensors (False: its lists are of ints, floats...)
    lists_may_hold_tensors: bool
    # the op's C++ entry point: what ``func(...)`` calls, without OpOverload.__call__'s frame
    call: Any


# op overload -> its OpInfo
_op_infos: dict[Any, OpInfo] = {}
# id(op overload) -> its OpInfo, for the recorder's one lookup per op (an OpOverload's own
# __hash__ is Python code). Safe: _op_infos holds every overload seen, so no id is reused
op_infos_by_id: dict[int, OpInfo] = {}


def op_info(func: torch._ops.OpOverload) -> OpInfo:
    info = _op_infos.get(func)
    if info is None:
        packet = func._overloadpacket
        is_view, is_inplace = schema_kind(func)
        info = _op_infos[func] = OpInfo(
            name=str(func),
            is_view=is_view,
            is_inplace=is_inplace,
            allocates_only=func in _ALLOCATING,
            has_flops=(
                packet in _SDPA_FORWARD or packet in _SDPA_BACKWARD or packet in _GROUPED_MM
                or packet in flop_registry
            ),
            is_profiler=func.namespace == "profiler",
            lists_may_hold_tensors=lists_may_hold_tensors(func),
            call=getattr(func, "_op", func),
        )
        op_infos_by_id[id(func)] = info
    return info


# container argument types (as their schema prints them) that cannot hold a tensor
_TENSORLESS_CONTAINERS = frozenset({
    "List[int]", "Optional[List[int]]", "List[float]", "Optional[List[float]]", "List[bool]",
    "Optional[List[bool]]", "List[str]", "Optional[List[str]]", "List[complex]",
})


def lists_may_hold_tensors(func: torch._ops.OpOverload) -> bool:
    """Whether a container argument of ``func`` may hold a tensor, by its schema (True when
    unsure): the recorder walks the containers of those ops only."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return True
    for arg in schema.arguments:
        kind = str(arg.type)
        is_container = "List" in kind or "Tuple" in kind or "Dict" in kind
        if is_container and kind not in _TENSORLESS_CONTAINERS:
            return True
        if kind == "Any" or kind in ("t", "t1", "t2"):  # generic: anything, a list too
            return True
    return False


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


def grouped_mm_flops(a_shape, b_shape) -> int:
    """FLOPs of ``torch._grouped_mm(a, b, offs)``, which PyTorch's registry has no formula for
    (torch 2.11 and 2.13): each row of ``a`` meets one group's matrix, so the work is that of
    one matmul over all rows, ``2 * a.numel() * N``. That holds for a 2-D ``a`` by 3-D ``b`` (a
    mixture of experts' forward and input gradient), 2-D by 2-D with the groups along K (its
    weight gradient) and 3-D by 3-D (batched groups); a 3-D ``a`` by a 2-D ``b`` (groups along
    N) is ``2 * a.numel() * N / groups``."""
    a_numel = 1
    for size in a_shape:
        a_numel *= size
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_numel * b_shape[-1] // max(a_shape[0], 1)
    return 2 * a_numel * b_shape[-1]


_GROUPED_MM = {getattr(_aten, "_grouped_mm", None)} - {None}


def op_flops(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one op by PyTorch's registry (and a grouped matmul's, which it lacks); 0 for ops
    it has no formula for."""
    packet = func._overloadpacket
    if packet in _GROUPED_MM:
        return grouped_mm_flops(args[0].shape, args[1].shape)
    if packet in _SDPA_FORWARD:
        return sdpa_forward_flops(*(t.shape for t in args[:3]))
    if packet in _SDPA_BACKWARD:
        # four batched matmuls, twice the forward's work
        return 2 * sdpa_forward_flops(*(t.shape for t in args[1:4]))
    formula = flop_registry.get(packet)
    if formula is None:
        return 0
    # Formulas registered without get_raw see only shapes (torch wraps them to map tensors to
    # their shapes, keeping the original as __wrapped__), so their count is cached per shape
    # signature. The raw ones (varlen attention) read tensor values and are always called.
    key = None
    if hasattr(formula, "__wrapped__"):
        try:
            key = (func, _signature(args), _signature(kwargs), _signature(out))
            hit = _flops_by_signature.get(key)
        except TypeError:  # an argument that does not hash
            key = hit = None
        if hit is not None:
            return hit
    try:
        flops = int(formula(*args, **kwargs, out_val=out))
    except Exception as exc:  # a formula that rejects shapes must not fail the user's step
        _warn_once(packet, exc)
        return 0
    if key is not None:
        if len(_flops_by_signature) > _MAX_CACHED_SIGNATURES:
            _flops_by_signature.clear()
        _flops_by_signature[key] = flops
    return flops


_flops_by_signature: dict[tuple, int] = {}
_MAX_CACHED_SIGNATURES = 100_000


def _signature(x: Any) -> Any:
    """A hashable stand-in for a FLOP formula's argument: tensors become their shapes."""
    if isinstance(x, _Tensor):
        return (_Tensor, tuple(x.shape))
    if isinstance(x, (tuple, list)):
        return (type(x), tuple(_signature(i) for i in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _signature(v)) for k, v in x.items()))
    return x


_warned: set[Any] = set()


def _warn_once(packet: Any, exc: Exception) -> None:
    if packet not in _warned:
        _warned.add(packet)
        warnings.warn(f"levers: no FLOP count for {packet} ({exc}); counted as 0", stacklevel=3)
