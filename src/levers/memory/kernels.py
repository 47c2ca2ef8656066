"""Memory that GPU kernels take from the caching allocator beyond their outputs.

A fake (meta) kernel allocates only the outputs. On a GPU some ops also take buffers from the
caching allocator, which count in ``memory_allocated`` like any tensor:

- cuBLAS keeps one workspace per (handle, stream), and a handle per thread: one for the
  forward and optimizer (the main thread), one for backward (the autograd device thread). They
  are allocated at the first matmul on each thread and kept for the life of the process.
- Flash attention's backward (FlashAttention-2 ``mha_bwd``) allocates ``softmax_d`` [B, H,
  Lq rounded to 128] and, when the keys do not fit one tile, a float32 ``dq_accum`` [B, Lq
  rounded to 128, H, head dim rounded to 32]; with grouped-query attention it also allocates
  ``dk_expanded`` and ``dv_expanded`` with all the query heads. They live for the kernel.
- cuDNN attention's backward (the backend SDPA tries first on Hopper) takes a workspace of a
  float32 ``dq`` accumulator [B, H, Lq, E], a float32 [B, H, Lq] row sum and 512 bytes, and,
  with grouped-query attention, ``dk`` and ``dv`` expanded to all the query heads in the input
  dtype; they live for the kernel. (These sizes reproduce the H200 probe of torch 2.11 with
  cuDNN 9.19 byte for byte: ``attention_memory`` in ``bench/results/memory_calibration_h200``.)
- Memory-efficient attention's backward allocates ``delta`` [B, H, Lq] in float32 and, for a
  head dim above 64 in half precision, a float32 accumulator for ``grad_q``.
- Embedding backward sorts the indices: two int64 buffers of the number of indices.

Sizes of workspaces that vary with the library version (the cuBLAS workspace) come from the
calibration on an H200 with torch 2.11 (``bench/results/memory_calibration*``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MIB = 1 << 20

_MATMULS = {
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::addmv",
    "aten::mv", "aten::dot", "aten::_addmm_activation",
}  # fmt: skip


@dataclass(frozen=True)
class KernelModel:
    """Workspace sizes of a target: the cuBLAS workspace depends on the chip."""

    cublas_workspace_bytes: int
    # cuBLASLt (addmm with a bias epilogue) keeps its own 1 MiB workspace per thread
    cublaslt_workspace_bytes: int = 1 << 20

    @staticmethod
    def for_sm(sm: tuple[int, int]) -> KernelModel:
        # CUBLAS_WORKSPACE_CONFIG's default: ":4096:8" on sm90, ":4096:2:16:8" elsewhere
        if sm == (9, 0):
            return KernelModel(cublas_workspace_bytes=4096 * 8 * 1024)
        return KernelModel(cublas_workspace_bytes=4096 * 1024 * 2 + 16 * 1024 * 8)


@dataclass(frozen=True)
class Workspace:
    nbytes: int
    persistent: bool
    label: str


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def workspaces(
    model: KernelModel, func, args: tuple, out: Any, thread: str, seen: set
) -> list[Workspace]:
    """The buffers ``func`` takes besides its outputs, in allocation order.

    ``thread`` is "main" or "autograd"; ``seen`` holds the (library, thread) pairs that already
    own a workspace (updated here).
    """
    name = func._schema.name
    found: list[Workspace] = []
    if name in _MATMULS and ("cublas", thread) not in seen:
        seen.add(("cublas", thread))
        found.append(Workspace(model.cublas_workspace_bytes, True, "cuBLAS workspace"))
    if name == "aten::addmm" and ("cublaslt", thread) not in seen and _lt_eligible(args):
        seen.add(("cublaslt", thread))
        found.append(Workspace(model.cublaslt_workspace_bytes, True, "cuBLASLt workspace"))
    if name == "aten::_scaled_dot_product_flash_attention_backward":
        found.extend(_flash_backward(args))
    elif name == "aten::_scaled_dot_product_cudnn_attention_backward":
        found.extend(_cudnn_backward(args))
    elif name == "aten::_scaled_dot_product_efficient_attention_backward":
        found.extend(_efficient_backward(args))
    elif name == "aten::embedding_dense_backward":
        num_indices = args[1].numel()
        found.append(Workspace(num_indices * 8, False, "embedding backward sort"))
        found.append(Workspace(num_indices * 8, False, "embedding backward sort"))
    return found


def _lt_eligible(args: tuple) -> bool:
    # addmm goes through cublasLt's bias epilogue when the bias is a vector over the columns
    bias = args[0] if args else None
    return isinstance(bias, torch.Tensor) and bias.dim() == 1


def _flash_backward(args: tuple) -> list[Workspace]:
    # grad_out, query, key, value, out, logsumexp, ... in [B, H, L, E]
    query, key = args[1], args[2]
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    q_rounded = _round_up(q_len, 128)
    found = [Workspace(batch * heads * q_rounded * 4, False, "flash softmax_d")]
    block_n = 128 if head_dim > 64 else 256
    if k_len > block_n:
        dim_rounded = _round_up(head_dim, 32) if head_dim <= 192 else 256
        found.append(
            Workspace(batch * q_rounded * heads * dim_rounded * 4, False, "flash dq_accum")
        )
    if kv_heads != heads:
        itemsize = query.element_size()
        expanded = batch * k_len * heads * head_dim * itemsize
        found.append(Workspace(expanded, False, "flash dk_expanded"))
        found.append(Workspace(expanded, False, "flash dv_expanded"))
    return found


def _cudnn_backward(args: tuple) -> list[Workspace]:
    # grad_out, query, key, value, out, logsumexp, ... in [B, H, L, E]
    query, key, value = args[1], args[2], args[3]
    batch, heads, q_len, head_dim = query.shape
    kv_heads, k_len = key.shape[1], key.shape[2]
    found = [
        Workspace(batch * heads * q_len * head_dim * 4, False, "cuDNN attention dq accumulator"),
        Workspace(batch * heads * q_len * 4, False, "cuDNN attention row sum"),
        Workspace(512, False, "cuDNN attention workspace"),
    ]
    if kv_heads != heads:
        itemsize = query.element_size()
        found.append(
            Workspace(batch * heads * k_len * head_dim * itemsize, False, "cuDNN dk_expanded")
        )
        found.append(
            Workspace(
                batch * heads * k_len * value.shape[-1] * itemsize, False, "cuDNN dv_expanded"
            )
        )
    return found


def _efficient_backward(args: tuple) -> list[Workspace]:
    query = args[1]
    batch, heads, q_len, head_dim = query.shape
    found = [Workspace(batch * heads * q_len * 4, False, "efficient delta")]
    if query.dtype in (torch.float16, torch.bfloat16) and head_dim > 64:
        found.append(
            Workspace(batch * heads * q_len * head_dim * 4, False, "efficient grad_q accumulator")
        )
    return found
