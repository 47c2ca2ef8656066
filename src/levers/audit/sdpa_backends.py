"""Which SDPA backend a CUDA GPU would run for a recorded call, and why each other was ruled out.

A model of PyTorch's dispatch (``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``):
backends are tried in priority order and the first one enabled (not excluded by an
``sdpa_kernel`` pin) whose checks all pass runs. The default order is FLASH, EFFICIENT, MATH,
CUDNN; on sm90/sm100 with a recent cuDNN PyTorch moves CUDNN to the front. Only the checks that
dense training calls meet are modelled (dtype, mask, GQA, head_dim, causal with Lq != Lk,
dropout resolution, deterministic mode, sequence length 1); nested tensors and strides are not.

Every ``reason`` is one sentence a reader can act on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FLASH = "FLASH_ATTENTION"
EFFICIENT = "EFFICIENT_ATTENTION"
CUDNN = "CUDNN_ATTENTION"
MATH = "MATH"
FUSED = (CUDNN, FLASH, EFFICIENT)
# Relative speed for training calls on sm80+ (higher is faster): cuDNN and flash are the
# fused flash-style kernels; efficient is a fused kernel without flash's tiling; math is the
# unfused reference that materialises the scores.
SPEED = {CUDNN: 3, FLASH: 3, EFFICIENT: 2, MATH: 0}

# Memory-efficient attention rejects q and k/v with different head counts (enable_gqa) up to
# and including this torch; pytorch/pytorch#191085 adds GQA to it later.
EFFICIENT_REJECTS_GQA_THROUGH = (2, 13)
# cuDNN's head_dim limit for the versions levers supports (256 needs a newer cuDNN frontend).
CUDNN_MAX_HEAD_DIM = 128


@dataclass(frozen=True)
class Choice:
    """The backend a call runs, the order tried, and why each backend was ruled out."""

    backend: str  # the backend that runs
    order: tuple[str, ...]
    ruled_out: dict[str, str]  # backend -> reason it cannot run this call
    pinned_out: tuple[
        str, ...
    ]  # eligible backends excluded only by the sdpa_kernel pin
    outranked: tuple[str, ...]  # eligible, enabled backends that MATH ran ahead of

    def faster_eligible(self, than: str) -> list[str]:
        """Backends faster than ``than`` that could run the call if the pin or order allowed."""
        return [b for b in FUSED if SPEED[b] > SPEED[than] and b not in self.ruled_out]


def prefers_cudnn(sm: tuple[int, int], cudnn_version: int | None) -> bool:
    """Whether PyTorch puts CUDNN first: sm90 or sm100 with cuDNN newer than 9.15.

    Without a known cuDNN version (a CPU capture), a current wheel's cuDNN is assumed.
    """
    if sm[0] not in (9, 10):
        return False
    return cudnn_version is None or cudnn_version > 91500


def priority_order(sm: tuple[int, int], cudnn_version: int | None) -> tuple[str, ...]:
    if prefers_cudnn(sm, cudnn_version):
        return (CUDNN, FLASH, EFFICIENT, MATH)
    return (FLASH, EFFICIENT, MATH, CUDNN)


def _shape(meta: dict[str, Any] | None) -> list[int]:
    return list(meta["shape"]) if meta else []


def reasons(
    args: dict[str, Any],
    *,
    sm: tuple[int, int],
    torch_version: tuple[int, int],
    dtype: str,
    deterministic: bool = False,
) -> dict[str, str]:
    """Backend -> why it cannot run this call (absent when it can), pins aside."""
    q, k, v = (
        _shape(args.get("query")),
        _shape(args.get("key")),
        _shape(args.get("value")),
    )
    mask = args.get("attn_mask")
    low_precision = dtype in ("bfloat16", "float16")
    head_dim, head_dim_v = (q[-1] if q else 0), (v[-1] if v else 0)
    heads_q, heads_kv = (q[-3] if len(q) >= 3 else 1), (k[-3] if len(k) >= 3 else 1)
    len_q, len_k = (q[-2] if len(q) >= 2 else 0), (k[-2] if len(k) >= 2 else 0)
    dropout = float(args.get("dropout_p") or 0.0)
    gqa = heads_q != heads_kv
    out: dict[str, str] = {}

    flash = []
    if mask is not None:
        flash.append(
            f"it takes no attn_mask, and the call passes a dense {_mask_text(mask)} mask"
        )
    if not low_precision:
        flash.append(f"it needs fp16/bf16 inputs, and they are {dtype}")
    if head_dim != head_dim_v or head_dim > 256:
        flash.append(
            f"it needs equal q/k/v head_dim <= 256 (got {head_dim}, {head_dim_v})"
        )
    if args.get("is_causal") and len_q != len_k:
        flash.append(f"it rejects is_causal with Lq != Lk ({len_q} vs {len_k})")
    if flash:
        out[FLASH] = "; ".join(flash)

    efficient = []
    if gqa and torch_version <= EFFICIENT_REJECTS_GQA_THROUGH:
        efficient.append(
            f"it rejects grouped-query attention (enable_gqa with {heads_q} query heads over "
            f"{heads_kv} key/value heads) on torch {torch_version[0]}.{torch_version[1]}"
        )
    alignment = 8 if low_precision else 4
    if head_dim % alignment or head_dim_v % alignment:
        efficient.append(f"it needs head_dim divisible by {alignment} (got {head_dim})")
    if efficient:
        out[EFFICIENT] = "; ".join(efficient)

    cudnn = []
    if not low_precision:
        cudnn.append(f"it needs fp16/bf16 inputs, and they are {dtype}")
    if head_dim > CUDNN_MAX_HEAD_DIM or head_dim_v > CUDNN_MAX_HEAD_DIM or head_dim % 8:
        cudnn.append(
            f"it needs head_dim <= {CUDNN_MAX_HEAD_DIM} and divisible by 8 (got {head_dim})"
        )
    if dropout * 16 != int(dropout * 16):
        cudnn.append(f"its dropout resolution is 1/16 (got dropout_p={dropout})")
    if deterministic:
        cudnn.append("it is not deterministic, and deterministic algorithms are on")
    if len_k == 1:
        cudnn.append("it rejects a key/value sequence of length 1")
    if sm < (8, 0):
        cudnn.append(f"it needs sm80 or newer (target is sm{sm[0]}{sm[1]})")
    if cudnn:
        out[CUDNN] = "; ".join(cudnn)
    return out


def _mask_text(mask: dict[str, Any]) -> str:
    return f"[{', '.join(str(d) for d in mask['shape'])}] {mask['dtype']}"


def choose(
    args: dict[str, Any],
    *,
    sm: tuple[int, int],
    torch_version: tuple[int, int],
    dtype: str,
    cudnn_version: int | None = None,
    deterministic: bool = False,
) -> Choice:
    """The backend a CUDA GPU of capability ``sm`` picks for a call with these arguments."""
    enabled = set(args.get("backends_enabled") or (FLASH, EFFICIENT, MATH, CUDNN))
    ruled_out = reasons(
        args,
        sm=sm,
        torch_version=torch_version,
        dtype=dtype,
        deterministic=deterministic,
    )
    order = priority_order(sm, cudnn_version)
    pinned_out = tuple(b for b in FUSED if b not in enabled and b not in ruled_out)
    backend = "ERROR"
    for candidate in order:
        if candidate in enabled and candidate not in ruled_out:
            backend = candidate
            break
    outranked: tuple[str, ...] = ()
    if backend == MATH:
        after = order[order.index(MATH) + 1 :]
        outranked = tuple(b for b in after if b in enabled and b not in ruled_out)
    return Choice(backend, order, ruled_out, pinned_out, outranked)
