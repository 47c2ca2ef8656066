"""Ops whose composite implementation takes a different path on CUDA than on the CPU.

Some ``CompositeImplicitAutograd`` ops branch on the device, and the branch decides what is
saved for backward:

- ``rms_norm``: on CUDA it calls the fused kernel ``_fused_rms_norm``, which keeps the input
  and a float32 ``rstd`` per row; on the CPU it runs ~6 elementwise ops whose float32
  intermediates autograd keeps (several input-sized tensors per norm).
- ``dropout``: on CUDA ``native_dropout`` keeps a one-byte mask; on the CPU the mask is a
  tensor of the input's dtype.
- ``softmax``/``log_softmax`` of a float16 input with ``dtype=float32``: on CUDA the kernel
  reads fp16 and writes fp32 (``half_to_float``); on the CPU the input is first copied to fp32.

While a prediction runs, the ``AutogradCPU`` key of these ops gets a Python kernel that takes
the CUDA path for tensors booked on the GPU (see :mod:`levers.memory.standin`) and the usual
composite otherwise. Undone on exit.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import torch

from levers.memory import compiled
from levers.memory.standin import GPU, DeviceBook

_KEY = "AutogradCPU"
aten = torch.ops.aten


class _FusedRmsNorm(torch.autograd.Function):
    """``_fused_rms_norm`` as CUDA runs it: allocates the output and ``rstd``, nothing else,
    and saves the input, ``rstd`` and the weight for ``_fused_rms_norm_backward``."""

    @staticmethod
    def forward(ctx, x, normalized_shape, weight, eps):  # type: ignore[override]
        stat_shape = tuple(x.shape[: x.dim() - len(normalized_shape)]) + (1,) * len(
            normalized_shape
        )
        stat_dtype = (
            torch.float32 if x.dtype in (torch.float16, torch.bfloat16, torch.float32) else x.dtype
        )
        out = torch.empty_like(x)
        rstd = x.new_empty(stat_shape, dtype=stat_dtype)
        ctx.normalized_shape = list(normalized_shape)
        ctx.has_weight = weight is not None
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        # _fused_rms_norm_backward allocates the input's and the weight's gradients, nothing
        # else (seen on an H200); not every torch has its meta kernel, so allocate them here
        x, _rstd, weight = ctx.saved_tensors
        grad_input = torch.empty_like(x) if ctx.needs_input_grad[0] else None
        grad_weight = None
        if ctx.has_weight and ctx.needs_input_grad[2]:
            grad_weight = torch.empty_like(weight)
        return grad_input, None, grad_weight, None


def _on_gpu(book: DeviceBook, tensor: Any) -> bool:
    # a graph compiled in a prediction is traced on dynamo's own fakes, which the book does not
    # know: every tensor there stands for the GPU's
    return isinstance(tensor, torch.Tensor) and (
        book.device_of(tensor) == GPU or compiled.tracing()
    )


def _rms_norm(book: DeviceBook):
    def kernel(x, normalized_shape, weight=None, eps=None):
        if compiled.tracing():
            # the op CUDA's composite calls; inductor's decompositions then split it, and its
            # partitioner chooses what to keep (not _FusedRmsNorm's allocation-only stand-in)
            return aten._fused_rms_norm(x, list(normalized_shape), weight, eps)[0]
        if not _on_gpu(book, x):
            return aten.rms_norm.default.decompose(x, normalized_shape, weight, eps)
        return _FusedRmsNorm.apply(x, tuple(normalized_shape), weight, eps)

    return kernel


def _dropout(book: DeviceBook):
    def kernel(x, p, train):
        if _on_gpu(book, x) and train and 0.0 < p < 1.0 and x.numel() > 0:
            return aten.native_dropout(x, p, train)[0]
        return aten.dropout.default.decompose(x, p, train)

    return kernel


def _softmax(book: DeviceBook, fused, composite):
    def kernel(x, dim, dtype=None):
        if _on_gpu(book, x) and x.dtype == torch.float16 and dtype == torch.float32:
            return fused(x, dim, True)
        return composite.decompose(x, dim, dtype)

    return kernel


@contextlib.contextmanager
def cuda_composites(book: DeviceBook) -> Iterator[None]:
    """Route the ops above through their CUDA paths for GPU-booked tensors; undone on exit."""
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        library.impl("rms_norm", _rms_norm(book), _KEY)
        library.impl("dropout", _dropout(book), _KEY)
        library.impl("softmax.int", _softmax(book, aten._softmax, aten.softmax.int), _KEY)
        library.impl(
            "log_softmax.int", _softmax(book, aten._log_softmax, aten.log_softmax.int), _KEY
        )
    try:
        yield
    finally:
        library._destroy()
        compiled.forget_dispatch_caches()
