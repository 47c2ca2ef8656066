"""Real values for the small integer and boolean tensors of a fake step.

Fake tensors have shapes but no values, and some steps read values: ``int(mask.sum())`` sizes a
slice, ``bool(ids.any())`` picks a branch, ``x[mask]`` has as many rows as ``mask`` has true
elements. Those values come from token ids, labels, masks and indices: integer and boolean
tensors that are small next to the activations, and that a step computes from each other and
from constants. So alongside the fake step, every integer or boolean tensor whose inputs all
have known values gets a real CPU "shadow" copy, computed by the same op. Reads of a value
(``.item()``, ``bool()``), and ops whose output size depends on values (``nonzero``,
boolean indexing, ``masked_select``), use the shadow.

Where no shadow exists (a mask computed from activations), the answer is an assumption, and it
is recorded: a read gives 0 (False), and a boolean mask is taken as all true (the largest size,
so the prediction errs on the high side).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

# Shadows are real memory on the host: cap each one (elements).
MAX_SHADOW_NUMEL = 1 << 24
MAX_FLOAT_NUMEL = 16
_VALUE_DTYPES = {
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
}  # fmt: skip
# These create tensors whose values are whatever the memory held: no shadow.
_NO_VALUES = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted",
}  # fmt: skip
aten = torch.ops.aten


def _geometry(tensor: torch.Tensor) -> tuple:
    return tensor.dtype, tuple(tensor.shape), tensor.stride(), tensor.storage_offset()


class _ShadowTable:
    """Shadows by fake tensor, holding no reference to the tensor itself, not even a weak one:
    ``Module._apply`` swaps a fake parameter's contents (``.to(dtype)`` on a module built under
    fake tensors: DeepSeek-V4's norms in their ``__init__``), and ``torch.utils.swap_tensors``
    refuses a tensor that anything references weakly. An entry is found by the tensor's id and
    kept only while the tensor's storage lives, and with the view it was made for."""

    def __init__(self) -> None:
        self._entries: dict[int, tuple[weakref.ref, tuple, torch.Tensor]] = {}

    def __setitem__(self, tensor: torch.Tensor, real: torch.Tensor) -> None:
        key = id(tensor)

        def drop(ref: weakref.ref) -> None:  # the storage died: so did every tensor on it
            entry = self._entries.get(key)
            if entry is not None and entry[0] is ref:
                del self._entries[key]

        self._entries[key] = (weakref.ref(tensor.untyped_storage(), drop), _geometry(tensor), real)

    def get(self, tensor: torch.Tensor, default: Any = None) -> Any:
        entry = self._entries.get(id(tensor))
        if entry is None:
            return default
        storage, geometry, real = entry
        if storage() is not tensor.untyped_storage() or geometry != _geometry(tensor):
            return default  # another tensor that reuses a dead one's id
        return real

    def pop(self, tensor: torch.Tensor, default: Any = None) -> Any:
        value = self.get(tensor, default)
        self._entries.pop(id(tensor), None)
        return value


class ShadowValues:
    """Keeps real copies of small integer/boolean fake tensors and answers value reads."""

    def __init__(self) -> None:
        self._shadows = _ShadowTable()
        self.assumptions: list[str] = []

    def value(self, tensor: torch.Tensor) -> torch.Tensor | None:
        return self._shadows.get(tensor)

    def count_not_equal(self, tensor: torch.Tensor, value: int) -> int | None:
        """How many elements of ``tensor`` differ from ``value``, if its values are known."""
        shadow = self._shadows.get(tensor)
        if shadow is None:
            return None
        with _disable_current_modes():
            return int((shadow != value).sum())

    def answer(self, func, args: tuple, kwargs: dict) -> Any:
        """Run a value-dependent op with the shadows, or return ``NotImplemented``."""
        packet = func.overloadpacket
        if packet is aten._local_scalar_dense:
            return self._scalar(args[0], func)
        if packet is aten.nonzero:
            return self._nonzero(args[0])
        if packet is aten.masked_select:
            return self._masked_select(args[0], args[1])
        if packet in (aten.index, aten._unsafe_index) and _has_bool_index(args[1]):
            return func(args[0], self._long_indices(args[1]))
        if packet in (aten.index_put_, aten.index_put, aten._index_put_impl_) and _has_bool_index(
            args[1]
        ):
            return func(args[0], self._long_indices(args[1]), *args[2:], **kwargs)
        return NotImplemented

    def after(self, func, args: tuple, kwargs: dict, out: Any) -> None:
        """Compute the shadows of ``func``'s outputs (and of the inputs it mutates) where possible."""
        mutated = _mutated_inputs(func, args)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        wanted = [t for t in outputs if _shadowable(t)] + [t for t in mutated if _shadowable(t)]
        for tensor in mutated:
            if not _shadowable(tensor):
                self._shadows.pop(tensor, None)
        if not wanted or func._schema.name in _NO_VALUES:
            return
        real_args, real_kwargs, known = self._real_arguments(args, kwargs)
        if not known:
            self._forget(mutated)
            return
        try:
            with unset_fake_temporarily():
                # in-place ops update the shadows of their inputs in place
                real_out = func(*real_args, **_on_cpu(real_kwargs))
        except Exception:  # a shadow is a convenience; the fake step goes on without it
            self._forget(mutated)
            return
        real_outputs = [t for t in tree_flatten(real_out)[0] if isinstance(t, torch.Tensor)]
        for fake, real in zip(outputs, real_outputs):
            if _shadowable(fake) and tuple(real.shape) == tuple(fake.shape):
                self._shadows[fake] = real

    def _forget(self, tensors: list) -> None:
        for tensor in tensors:
            self._shadows.pop(tensor, None)

    def _real_arguments(self, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
        known = True

        def real(value: Any) -> Any:
            nonlocal known
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                return value  # a real tensor (a constant) is its own shadow
            if isinstance(value, torch.Tensor):
                shadow = self._shadows.get(value)
                if shadow is None:
                    known = False
                    return value
                return shadow
            return value

        real_args = tree_map(real, args)
        real_kwargs = tree_map(real, kwargs)
        return real_args, real_kwargs, known

    def _scalar(self, tensor: torch.Tensor, func) -> Any:
        shadow = self._shadows.get(tensor)
        if shadow is not None:
            with _disable_current_modes():
                return shadow.item()
        self.assumptions.append(
            f"a step read the value of a {str(tensor.dtype).removeprefix('torch.')} tensor "
            "computed from activations; 0 was assumed"
        )
        if tensor.dtype == torch.bool:
            return False
        return 0.0 if tensor.is_floating_point() else 0

    def _nonzero(self, mask: torch.Tensor) -> torch.Tensor:
        shadow = self._shadows.get(mask)
        if shadow is not None:
            with _disable_current_modes():
                real = torch.nonzero(shadow)
            fake = torch.empty(tuple(real.shape), dtype=torch.long, device=mask.device)
            self._shadows[fake] = real
            return fake
        self.assumptions.append(
            f"a mask of {mask.numel()} elements computed from activations selected rows; all "
            "were assumed selected"
        )
        return torch.empty((mask.numel(), mask.dim()), dtype=torch.long, device=mask.device)

    def _masked_select(self, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        shape = torch.broadcast_shapes(values.shape, mask.shape)
        shadow = self._shadows.get(mask)
        if shadow is not None:
            with _disable_current_modes():
                count = int(shadow.expand(shape).sum())
        else:
            count = 1
            for size in shape:
                count *= size
            self.assumptions.append(
                "masked_select over a mask computed from activations: all selected"
            )
        return torch.empty((count,), dtype=values.dtype, device=values.device)

    def _long_indices(self, indices: list) -> list:
        converted = []
        for index in indices:
            if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
                positions = self._nonzero(index)
                converted.extend(positions.unbind(1))
            else:
                converted.append(index)
        return converted


def _shadowable(tensor: torch.Tensor) -> bool:
    if tensor.dtype in _VALUE_DTYPES:
        return tensor.numel() <= MAX_SHADOW_NUMEL
    # float scalars too: step counters and other bookkeeping that a step may read back
    return tensor.is_floating_point() and tensor.numel() <= MAX_FLOAT_NUMEL


def _has_bool_index(indices: Any) -> bool:
    return any(
        isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
        for index in (indices or [])
    )


def _mutated_inputs(func, args: tuple) -> list[torch.Tensor]:
    """The tensors that ``func`` writes to in place (``self`` or a ``self`` tensor list)."""
    arguments = func._schema.arguments
    if not arguments or not args:
        return []
    alias = arguments[0].alias_info
    if alias is None or not alias.is_write:
        return []
    first = args[0]
    if isinstance(first, torch.Tensor):
        return [first]
    if isinstance(first, (list, tuple)):
        return [t for t in first if isinstance(t, torch.Tensor)]
    return []


def _on_cpu(kwargs: dict) -> dict:
    if "device" in kwargs:
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs
