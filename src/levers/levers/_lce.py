"""Linear + cross-entropy without the full logits: the kernels behind fused-linear-cross-entropy.

``linear_cross_entropy(hidden_nd, weight_vd, targets_n)`` is ``F.cross_entropy(F.linear(hidden,
weight).float(), targets, ignore_index)`` with the sum divided by ``denominator`` (by default the
number of real targets: the mean over them). It picks, in order:

- ``liger``: Liger Kernel's ``LigerFusedLinearCrossEntropyLoss`` (CUDA, ``pip install
  liger-kernel``): chunks the rows and writes the logit gradient in place;
- ``cce``: Apple's Cut Cross-Entropy ``linear_cross_entropy`` (CUDA, ``pip install
  cut-cross-entropy``): never writes the logits to memory at all;
- ``chunked``: plain PyTorch, any device. Rows are taken ``chunk_rows`` at a time, each chunk's
  head matmul and loss under ``torch.utils.checkpoint``, so only one chunk's logits exist in the
  forward and each is recomputed, then freed, in the backward.

Shapes: N rows, D width, V vocabulary.

In a memory prediction for a GPU (``levers memory --lever fused-linear-cross-entropy``, fake
tensors) Liger's Triton kernels cannot run: :class:`_LigerAllocations` stands for them, making
the tensors Liger's forward makes (its gradient buffers, one chunk of logits at a time) with the
same shapes, dtypes and lifetimes, and none of its arithmetic. ``auto`` there picks what this
machine has installed; ``kernel="liger"`` predicts Liger's memory without the package.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from levers.memory.standin import predicted_capability

DEFAULT_CHUNK_ROWS = 4096
KERNELS = ("auto", "liger", "cce", "chunked")


def available_kernel(device: torch.device, requested: str = "auto") -> str:
    """The kernel ``linear_cross_entropy`` will use on ``device``; raises if one named is absent."""
    if requested not in KERNELS:
        raise ValueError(f"kernel={requested!r} is not one of {', '.join(KERNELS)}")
    on_cuda = device.type == "cuda"
    have = {
        "liger": on_cuda and (
            importlib.util.find_spec("liger_kernel") is not None
            or (requested == "liger" and _predicting())
        ),
        "cce": on_cuda and importlib.util.find_spec("cut_cross_entropy") is not None,
        "chunked": True,
    }
    if requested != "auto":
        if not have[requested]:
            raise ValueError(
                f"kernel={requested!r} needs CUDA and its package installed "
                "(pip install 'levers[kernels]'); use kernel='chunked' here"
            )
        return requested
    return next(name for name in ("liger", "cce", "chunked") if have[name])


def _chunk_loss(hidden: torch.Tensor, weight: torch.Tensor, bias: Any, targets: torch.Tensor,
                ignore_index: int) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits, targets, ignore_index=ignore_index, reduction="sum")


def chunked_linear_cross_entropy(
    hidden_nd: torch.Tensor,
    weight_vd: torch.Tensor,
    targets_n: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """The summed cross-entropy, one checkpointed chunk of rows at a time."""
    total = hidden_nd.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden_nd.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        total = total + checkpoint(
            _chunk_loss, hidden_nd[rows], weight_vd, bias, targets_n[rows], ignore_index,
            use_reentrant=False,
        )
    return total


def linear_cross_entropy(
    hidden_nd: torch.Tensor,
    weight_vd: torch.Tensor,
    targets_n: torch.Tensor,
    *,
    bias: torch.Tensor | None = None,
    ignore_index: int = -100,
    denominator: Any = None,
    kernel: str = "auto",
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``targets``, summed over the real
    targets and divided by ``denominator`` (default: their number)."""
    chosen = available_kernel(hidden_nd.device, kernel)
    if chosen == "liger" and _predicting():
        summed = _LigerAllocations.apply(hidden_nd, weight_vd, targets_n, bias)
    elif chosen == "liger":
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

        summed = LigerFusedLinearCrossEntropyLoss(ignore_index=ignore_index, reduction="sum")(
            weight_vd, hidden_nd, targets_n, bias
        )
        # versions that can also return a z-loss or accuracies wrap the loss
        summed = getattr(summed, "loss", summed)
        if isinstance(summed, tuple):
            summed = summed[0]
    elif chosen == "cce":
        from cut_cross_entropy import linear_cross_entropy as cce

        summed = cce(hidden_nd, weight_vd, targets_n, bias=bias, ignore_index=ignore_index,
                     reduction="sum")
    else:
        summed = chunked_linear_cross_entropy(
            hidden_nd, weight_vd, targets_n, bias=bias, ignore_index=ignore_index,
            chunk_rows=chunk_rows,
        )
    if denominator is None:
        denominator = (targets_n != ignore_index).sum()
    if isinstance(denominator, torch.Tensor):
        denominator = denominator.to(summed.device)
    return summed / denominator


def _predicting() -> bool:
    """Whether a memory prediction for a GPU runs now (its tensors are fakes)."""
    return predicted_capability() is not None


class _LigerAllocations(torch.autograd.Function):
    """What Liger Kernel's fused linear cross-entropy (0.8) allocates, for memory predictions.

    Its forward computes the gradients too: ``grad_input`` like the hidden states and
    ``grad_weight`` like the head's weight (kept for backward, which scales them in place), and
    one chunk of logits at a time, in the matmul's dtype, of ``next_pow2(ceil(N / ceil(V / D)))``
    rows, from which each chunk's gradients are taken. The returned loss is a zero: only the
    allocations are Liger's."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, bias):  # noqa: ANN001, ANN205 - autograd's API
        rows, width = hidden.shape
        chunk = min(_next_power_of_2(-(-rows // -(-weight.shape[0] // width))), rows)
        grad_input = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
        grad_bias = torch.zeros_like(bias) if bias is not None else None
        loss_rows = hidden.new_zeros(rows, dtype=torch.float32)
        for start in range(0, rows, chunk):
            part = hidden[start : start + chunk]
            logits = part @ weight.t()  # the logit gradient is written into it in place
            grad_input[start : start + chunk] = logits @ weight
            if grad_weight is not None:
                # accumulated in place by addmm(out_dtype=float32) on sm80+: only the chunk's
                # cast to the logits' dtype is new memory
                cast = part.to(logits.dtype)
                del cast
            if grad_bias is not None:
                grad_bias += logits.sum(dim=0).to(grad_bias.dtype)
            del logits, part
        ctx.save_for_backward(grad_input, grad_weight, grad_bias)
        return loss_rows.sum()

    @staticmethod
    def backward(ctx, grad_loss):  # noqa: ANN001, ANN205 - autograd's API
        grad_input, grad_weight, grad_bias = ctx.saved_tensors
        return grad_input, grad_weight, None, grad_bias


def _next_power_of_2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()
