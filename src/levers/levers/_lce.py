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
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_ROWS = 4096
KERNELS = ("auto", "liger", "cce", "chunked")


def available_kernel(device: torch.device, requested: str = "auto") -> str:
    """The kernel ``linear_cross_entropy`` will use on ``device``; raises if one named is absent."""
    if requested not in KERNELS:
        raise ValueError(f"kernel={requested!r} is not one of {', '.join(KERNELS)}")
    on_cuda = device.type == "cuda"
    have = {
        "liger": on_cuda and importlib.util.find_spec("liger_kernel") is not None,
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
    if chosen == "liger":
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
