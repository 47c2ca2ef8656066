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

Random draws are values too: a masked LM's targets are the tokens where ``torch.rand(shape) <
0.15`` (or ``torch.bernoulli`` of a ``torch.full`` of 0.15, as Hugging Face's collator draws
them), and what selects the rows with a target (``nonzero``, loss-valid-rows) sizes what follows.
So the float outputs of the draws and fills in :data:`_FLOAT_SOURCES` are shadowed too (up to
:data:`MAX_SHADOW_NUMEL` elements), each draw from the shadows' own host generator: the same
distribution as the step's, not its values; where a value or a size the step reads comes from
such a draw, that is recorded as an assumption (a count of rows drawn at 15% of 16384 tokens
varies by about 2% from draw to draw). Other float outputs are not
shadowed (activations), so no chain of float work is run on the host.
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
# the uniform draws a mask is drawn from, then constant fills: their float outputs get shadows
# (see the module's docstring); not the normal draws, which make inputs (an image batch's pixels)
_DRAWS = {
    "aten::rand", "aten::rand_like", "aten::uniform_", "aten::bernoulli", "aten::bernoulli_",
}  # fmt: skip
_FLOAT_SOURCES = _DRAWS | {
    "aten::full", "aten::full_like", "aten::fill_", "aten::masked_fill", "aten::masked_fill_",
}  # fmt: skip
DRAW_ASSUMPTION = (
    "values the step read or rows it selected (a masked LM's targets, say) came from random "
    "draws, made on the host: the same distribution as the step's, not its values"
)


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
        self._draws = torch.Generator().manual_seed(0)  # the host's draws (_DRAWS), repeatable
        self._drawn: set[int] = set()  # ids of the shadows computed from a draw (while alive)

    def _mark_drawn(self, real: torch.Tensor) -> None:
        key = id(real)
        if key not in self._drawn:
            self._drawn.add(key)
            weakref.finalize(real, self._drawn.discard, key)

    def _read(self, shadow: torch.Tensor) -> torch.Tensor:
        """``shadow``, about to size or decide what the step does: said where it was drawn."""
        if id(shadow) in self._drawn and DRAW_ASSUMPTION not in self.assumptions:
            self.assumptions.append(DRAW_ASSUMPTION)
        return shadow

    def value(self, tensor: torch.Tensor) -> torch.Tensor | None:
        return self._shadows.get(tensor)

    def count_not_equal(self, tensor: torch.Tensor, value: int) -> int | None:
        """How many elements of ``tensor`` differ from ``value``, if its values are known."""
        shadow = self._shadows.get(tensor)
        if shadow is None:
            return None
        with _disable_current_modes():  # levers' own count, not a read of the step's
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
        name = func._schema.name
        mutated = _mutated_inputs(func, args)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        wanted = ([t for t in outputs if _shadowable(t, name)]
                  + [t for t in mutated if _shadowable(t, name)])
        for tensor in mutated:
            if not _shadowable(tensor, name):
                self._shadows.pop(tensor, None)
        if not wanted or name in _NO_VALUES:
            return
        real_args, real_kwargs, known = self._real_arguments(args, kwargs)
        if not known:
            self._forget(mutated)
            return
        if name in _DRAWS:  # the step's generator is on its device: the host's own draws
            real_kwargs = {**real_kwargs, "generator": self._draws}
        try:
            with unset_fake_temporarily():
                # in-place ops update the shadows of their inputs in place
                real_out = func(*real_args, **_on_cpu(real_kwargs))
        except Exception:  # a shadow is a convenience; the fake step goes on without it
            self._forget(mutated)
            return
        real_outputs = [t for t in tree_flatten(real_out)[0] if isinstance(t, torch.Tensor)]
        drawn = name in _DRAWS or any(
            isinstance(t, torch.Tensor) and id(t) in self._drawn
            for t in tree_flatten((real_args, real_kwargs))[0])
        for fake, real in zip(outputs, real_outputs):
            if _shadowable(fake, name) and tuple(real.shape) == tuple(fake.shape):
                self._shadows[fake] = real
                if drawn:
                    self._mark_drawn(real)
        if drawn:  # an in-place op's input now holds values from a draw
            for tensor in mutated:
                real = self._shadows.get(tensor)
                if real is not None:
                    self._mark_drawn(real)

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
                return self._read(shadow).item()
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
                real = torch.nonzero(self._read(shadow))
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
                count = int(self._read(shadow).expand(shape).sum())
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


def _shadowable(tensor: torch.Tensor, op: str = "") -> bool:
    if tensor.dtype in _VALUE_DTYPES:
        return tensor.numel() <= MAX_SHADOW_NUMEL
    if not tensor.is_floating_point():
        return False
    # float scalars too: step counters and other bookkeeping that a step may read back; and the
    # draws and fills a mask is drawn from
    return tensor.numel() <= (MAX_SHADOW_NUMEL if op in _FLOAT_SOURCES else MAX_FLOAT_NUMEL)


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
