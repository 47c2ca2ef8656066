"""High-level calls that diagnosis needs, recorded with their arguments.

A ``TorchFunctionMode`` sees torch API calls before they become aten ops, so it knows what the
user asked for (an SDPA call with its mask and backend pins, a loss with its ignore_index, a
``bool()`` of a tensor) where the aten level only sees the consequences. The CUDA memory-metric
functions are plain Python functions, not torch functions: they are wrapped for the duration of
the capture and restored afterwards.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from levers.capture.ops import meta_of
from levers.capture.source import called_from_torch, in_data_pipeline, user_frame

_T = torch._C.TensorBase

# function -> call name, for calls that make the host wait for the device
_SYNC_CALLS: dict[Callable, str] = {
    _T.item: "Tensor.item",
    _T.__bool__: "Tensor.__bool__",
    _T.__int__: "Tensor.__int__",
    _T.__float__: "Tensor.__float__",
    _T.__index__: "Tensor.__index__",
    _T.tolist: "Tensor.tolist",
    _T.cpu: "Tensor.cpu",
    _T.numpy: "Tensor.numpy",
    _T.nonzero: "Tensor.nonzero",
    torch.nonzero: "torch.nonzero",
    _T.masked_select: "Tensor.masked_select",
    torch.masked_select: "torch.masked_select",
    torch.unique: "torch.unique",
    torch.Tensor.unique: "Tensor.unique",
    torch.unique_consecutive: "torch.unique_consecutive",
}
# calls that sync only for some arguments; decided by _conditional_sync
_MAYBE_SYNC_CALLS: dict[Callable, str] = {
    _T.__getitem__: "Tensor.__getitem__",
    _T.__setitem__: "Tensor.__setitem__",
    _T.repeat_interleave: "Tensor.repeat_interleave",
    torch.repeat_interleave: "torch.repeat_interleave",
    torch.where: "torch.where",
    _T.to: "Tensor.to",
}
_LOSS_CALLS: dict[Callable, str] = {
    F.cross_entropy: "cross_entropy",
    F.nll_loss: "nll_loss",
    F.log_softmax: "log_softmax",
    torch.log_softmax: "torch.log_softmax",
    _T.log_softmax: "Tensor.log_softmax",
    F.binary_cross_entropy_with_logits: "binary_cross_entropy_with_logits",
    F.binary_cross_entropy: "binary_cross_entropy",
}
_NORM_CALLS: dict[Callable, str] = {
    F.layer_norm: "layer_norm",
    F.group_norm: "group_norm",
}
if hasattr(F, "rms_norm"):
    _NORM_CALLS[F.rms_norm] = "rms_norm"
_SDPA = F.scaled_dot_product_attention
# function -> (kind, call name, whether it is recorded only when _conditional_sync says so)
_CALL_KINDS: dict[Callable, tuple[str, str, bool]] = {
    **{f: ("sync", name, True) for f, name in _MAYBE_SYNC_CALLS.items()},
    **{f: ("sync", name, False) for f, name in _SYNC_CALLS.items()},
    **{f: ("norm", name, False) for f, name in _NORM_CALLS.items()},
    **{f: ("loss", name, False) for f, name in _LOSS_CALLS.items()},
    _SDPA: ("sdpa", "scaled_dot_product_attention", False),
}

# the CUDA memory-metric functions wrapped during a capture
MEMORY_METRIC_FUNCTIONS = (
    "max_memory_allocated",
    "max_memory_reserved",
    "reset_peak_memory_stats",
    "reset_max_memory_allocated",
    "memory_allocated",
    "memory_reserved",
    "memory_stats",
)


def _tensor_meta(x: Any) -> dict[str, Any] | None:
    if not isinstance(x, torch.Tensor):
        return None
    m = meta_of(x)
    return {"shape": list(m.shape), "dtype": m.dtype, "device": m.device}


def _is_bool_index(index: Any) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _conditional_sync(func: Callable, args: tuple, kwargs: dict) -> bool:
    """Whether a call that only sometimes syncs does so with these arguments."""
    if func in (_T.__getitem__, _T.__setitem__):
        # boolean-mask indexing needs nonzero() to size its result
        return len(args) > 1 and _is_bool_index(args[1])
    if func in (_T.repeat_interleave, torch.repeat_interleave):
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        if func is torch.repeat_interleave and len(args) == 1:
            repeats = args[0]  # torch.repeat_interleave(repeats) form
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    if func is torch.where:
        return len(args) + len(kwargs) == 1  # where(cond) is nonzero(cond, as_tuple=True)
    if func is _T.to:
        targets = [a for a in args[1:] if isinstance(a, (str, torch.device))]
        targets += [kwargs["device"]] if "device" in kwargs else []
        return (
            isinstance(args[0], torch.Tensor)
            and args[0].device.type != "cpu"
            and any(torch.device(t).type == "cpu" for t in targets)
        )
    return False


def _sdpa_backends_enabled() -> list[str]:
    flags = {
        "FLASH_ATTENTION": torch.backends.cuda.flash_sdp_enabled(),
        "EFFICIENT_ATTENTION": torch.backends.cuda.mem_efficient_sdp_enabled(),
        "MATH": torch.backends.cuda.math_sdp_enabled(),
    }
    if hasattr(torch.backends.cuda, "cudnn_sdp_enabled"):
        flags["CUDNN_ATTENTION"] = torch.backends.cuda.cudnn_sdp_enabled()
    return [name for name, on in flags.items() if on]


def _sdpa_args(args: tuple, kwargs: dict) -> dict[str, Any]:
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return {
        "query": _tensor_meta(bound["query"]),
        "key": _tensor_meta(bound["key"]),
        "value": _tensor_meta(bound["value"]),
        "attn_mask": _tensor_meta(bound.get("attn_mask")),
        "dropout_p": float(bound.get("dropout_p", 0.0)),
        "is_causal": bool(bound.get("is_causal", False)),
        "scale": bound.get("scale"),
        "enable_gqa": bool(bound.get("enable_gqa", False)),
        "backends_enabled": _sdpa_backends_enabled(),
        "requires_grad": bool(
            torch.is_grad_enabled()
            and any(
                isinstance(bound.get(n), torch.Tensor) and bound[n].requires_grad
                for n in ("query", "key", "value")
            )
        ),
    }


def _loss_args(name: str, args: tuple, kwargs: dict) -> tuple[dict[str, Any], Any]:
    """The recorded arguments of a loss call, and the target tensor (or None)."""
    inp = args[0] if args else kwargs.get("input")
    target = args[1] if len(args) > 1 else kwargs.get("target")
    record: dict[str, Any] = {"input": _tensor_meta(inp)}
    if "log_softmax" in name:
        record["dim"] = args[1] if len(args) > 1 else kwargs.get("dim")
        record["dtype"] = str(kwargs.get("dtype")) if kwargs.get("dtype") is not None else None
        return record, None
    record["target"] = _tensor_meta(target)
    record["reduction"] = kwargs.get("reduction", "mean")
    if name in ("cross_entropy", "nll_loss"):
        record["ignore_index"] = kwargs.get("ignore_index", -100)
        record["label_smoothing"] = kwargs.get("label_smoothing", 0.0)
        record["has_weight"] = kwargs.get("weight") is not None
        integer_target = isinstance(target, torch.Tensor) and not target.is_floating_point()
        return record, target if integer_target else None
    return record, None


class CallRecorder(TorchFunctionMode):
    """Records sdpa, loss, norm and sync calls; everything else passes straight through."""

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        known = _CALL_KINDS.get(func)  # one lookup: this runs for every torch call of the step
        if known is None:
            return func(*args, **kwargs)
        kind, name, conditional = known
        if conditional and not _conditional_sync(func, args, kwargs):
            return func(*args, **kwargs)
        if not self.recorder.paused:
            self.recorder.note_autocast()
        record_args: dict[str, Any] = {}
        target = None
        if kind == "sdpa":
            record_args = _sdpa_args(args, kwargs)
        elif kind == "loss":
            record_args, target = _loss_args(name, args, kwargs)
        elif kind == "norm":
            record_args = {"input": _tensor_meta(args[0] if args else kwargs.get("input"))}
        elif kind == "sync":
            record_args = {
                "tensor": _tensor_meta(args[0] if args else None),
                # torch's own code (an optimizer reading its step counter) rather than the user's
                "caller_in_torch": called_from_torch(getattr(func, "__name__", "")),
                # a batch being made (a Dataset, a collate function): host-side work
                "in_data_pipeline": in_data_pipeline(),
            }
        first = self.recorder.num_ops
        out = func(*args, **kwargs)
        last = self.recorder.num_ops - 1
        self.recorder.add_call(
            kind, name, record_args, first if last >= first else None, last if last >= first else None,
            user_frame(), target,
        )
        return out


@contextlib.contextmanager
def memory_metric_calls(recorder: Any) -> Iterator[None]:
    """Wrap torch.cuda's memory-metric functions so each call is recorded; undone on exit."""
    namespaces = [torch.cuda, torch.cuda.memory]
    saved: list[tuple[Any, str, Callable]] = []

    depth = [0]  # metric functions call each other; record only the outermost call

    def wrap(name: str, original: Callable) -> Callable:
        @functools.wraps(original)
        def recorded(*args, **kwargs):
            if depth[0] == 0:
                recorder.add_call(
                    "memory_metric", f"torch.cuda.{name}", {}, None, None, user_frame(), None
                )
            depth[0] += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth[0] -= 1

        recorded.__levers_original__ = original  # type: ignore[attr-defined]
        return recorded

    try:
        for name in MEMORY_METRIC_FUNCTIONS:
            original = getattr(torch.cuda.memory, name, None)
            if original is None:
                continue
            wrapped = wrap(name, original)
            for ns in namespaces:
                if getattr(ns, name, None) is original:
                    saved.append((ns, name, original))
                    setattr(ns, name, wrapped)
        yield
    finally:
        for ns, name, original in saved:
            setattr(ns, name, original)
