"""Which SDPA kernel a GPU would run for each ``F.scaled_dot_product_attention`` call, and
running that kernel's op on the stand-in tensors so that its memory is the GPU's.

On a GPU, SDPA picks a backend per call (``select_sdp_backend`` in
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp``): the first of the priority order
whose constraints the call meets. The backends keep very different things for backward:

- flash, cuDNN and memory-efficient attention keep the output and a float32 logsumexp per query
  row (``B*H*L*4`` bytes);
- MATH materialises the scores and the softmax (``B*H*L*S`` elements, in float32 for fp16/bf16
  inputs since torch 2.5) and keeps them.

On a CPU, SDPA would pick the CPU flash kernel or MATH, so this module makes the choice as the
target GPU would and calls the chosen backend's aten op directly (the ops have meta kernels, so
they run on fake tensors anywhere). The choice follows the constraints of ``sdp_utils.cpp``
for dense inputs; the default priority order on sm90 with torch >= 2.9 and a recent cuDNN puts
cuDNN first (``check_prefer_cudnn_attention``). The user's own backend pins
(``sdpa_kernel``, ``torch.backends.cuda.enable_*_sdp``) are honoured.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MATH, FLASH, EFFICIENT, CUDNN = "math", "flash", "efficient", "cudnn"
# torch.nn.attention.SDPBackend values
_BACKEND_IDS = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}
# the priority order of a CPU build (and of a GPU one that prefers flash)
_BUILD_DEFAULT_ORDER = (FLASH, EFFICIENT, MATH, CUDNN)
_HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class SdpaTarget:
    """What the choice depends on besides the call: the chip and the default priority."""

    sm: tuple[int, int]
    prefers_cudnn: bool  # cuDNN first in the default priority order
    cudnn_max_head_dim: int = 128
    efficient_supports_gqa: bool = False


@dataclass(frozen=True)
class SdpaCall:
    """One SDPA call of the step and the backend the target GPU would run."""

    backend: str
    query_shape: tuple[int, ...]
    key_shape: tuple[int, ...]
    dtype: str
    has_mask: bool
    is_causal: bool
    enable_gqa: bool
    requires_grad: bool
    rejected: tuple[str, ...]  # "backend: reason" for each backend tried before it


def target_for(sm: tuple[int, int]) -> SdpaTarget:
    """The SDPA target of a GPU of compute capability ``sm``.

    On an H200 with torch 2.11 (cuDNN 9.19), SDPA tried cuDNN first and cuDNN took head dims up
    to 256; this matched the real choice on all 384 calls of the probe grid in
    ``bench/results/memory_calibration_h200``.
    """
    hopper_or_newer = sm[0] in (9, 10) and sm[1] == 0
    return SdpaTarget(
        sm=sm, prefers_cudnn=hopper_or_newer, cudnn_max_head_dim=256 if hopper_or_newer else 128
    )


def priority_order(target: SdpaTarget) -> tuple[str, ...]:
    """The order in which the target tries the backends, honouring a user-set order."""
    getter = getattr(torch._C, "_get_sdp_priority_order", None)
    if getter is None:  # a torch without user-set priorities
        return (CUDNN, FLASH, EFFICIENT, MATH) if target.prefers_cudnn else _BUILD_DEFAULT_ORDER
    order = tuple(_BACKEND_IDS[int(i)] for i in getter() if int(i) in _BACKEND_IDS)
    if order != _BUILD_DEFAULT_ORDER:
        return order  # set by sdpa_kernel(..., set_priority=True)
    if target.prefers_cudnn:
        return (CUDNN, FLASH, EFFICIENT, MATH)
    return _BUILD_DEFAULT_ORDER


def _enabled() -> dict[str, bool]:
    return {
        FLASH: torch.backends.cuda.flash_sdp_enabled(),
        EFFICIENT: torch.backends.cuda.mem_efficient_sdp_enabled(),
        MATH: torch.backends.cuda.math_sdp_enabled(),
        CUDNN: torch.backends.cuda.cudnn_sdp_enabled(),
    }


def _requires_grad(q, k, v) -> bool:
    return torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)


def _common_reason(q, k, v, enable_gqa: bool, supports_gqa: bool) -> str | None:
    if not (q.dim() == k.dim() == v.dim() == 4):
        return "needs 4-d query, key and value"
    if q.shape[0] != k.shape[0] or k.shape[0] != v.shape[0]:
        return "batch sizes differ"
    if k.shape[1] != v.shape[1]:
        return "key and value head counts differ"
    if q.shape[1] != k.shape[1]:
        if not enable_gqa:
            return "query and key head counts differ without enable_gqa"
        if not supports_gqa:
            return "no grouped-query attention"
        if q.shape[1] % k.shape[1] != 0:
            return "query heads are not a multiple of key heads"
    if 0 in (q.shape[2], k.shape[2]):
        return "empty sequence"
    for tensor in (q, k, v):
        if tensor.stride(-1) != 1 and tensor.shape[-1] != 1:
            return "last dimension is not contiguous"
    return None


def _flash_reason(q, k, v, mask, dropout_p, is_causal, enable_gqa, target) -> str | None:
    if target.sm < (8, 0):
        return "needs sm80 or newer"
    if mask is not None:
        return "takes no attention mask"
    if q.dtype not in _HALF:
        return f"needs fp16/bf16, got {q.dtype}"
    if not (q.shape[-1] == k.shape[-1] == v.shape[-1] and q.shape[-1] <= 256):
        return "needs equal head dims of at most 256"
    if is_causal and q.shape[2] != k.shape[2]:
        return "is_causal needs equal query and key lengths"
    if target.sm in ((8, 6), (8, 9)) and _requires_grad(q, k, v) and 192 < q.shape[-1] <= 224:
        return "no training with head dim in (192, 224] on this chip"
    return _common_reason(q, k, v, enable_gqa, supports_gqa=True)


def _efficient_reason(q, k, v, mask, dropout_p, is_causal, enable_gqa, target) -> str | None:
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return f"needs fp16/bf16/fp32, got {q.dtype}"
    alignment = 8 if q.dtype in _HALF else 4
    if q.shape[-1] != k.shape[-1] or q.shape[-1] % alignment or v.shape[-1] % alignment:
        return f"head dims must match and be multiples of {alignment}"
    return _common_reason(q, k, v, enable_gqa, supports_gqa=target.efficient_supports_gqa)


def _cudnn_reason(q, k, v, mask, dropout_p, is_causal, enable_gqa, target) -> str | None:
    if target.sm < (8, 0):
        return "needs sm80 or newer"
    if q.dtype not in _HALF:
        return f"needs fp16/bf16, got {q.dtype}"
    if dropout_p * 16.0 != math.floor(dropout_p * 16.0):
        return "dropout is not a multiple of 1/16"
    if torch.are_deterministic_algorithms_enabled():
        return "not deterministic"
    head_dim, value_dim = q.shape[-1], v.shape[-1]
    if head_dim > target.cudnn_max_head_dim or value_dim > target.cudnn_max_head_dim:
        return f"head dim above {target.cudnn_max_head_dim}"
    if head_dim % 8 or value_dim % 8:
        return "head dim is not a multiple of 8"
    if k.shape[2] == 1:
        return "key length 1"
    if isinstance(mask, torch.Tensor) and mask.requires_grad:
        # its backward gives no gradient for the bias (a Swin's learned relative position bias):
        # autograd raises "not differentiable with respect to argument 'attn_bias'"
        return "an attention bias that requires grad"
    return _common_reason(q, k, v, enable_gqa, supports_gqa=True)


_REASONS = {FLASH: _flash_reason, EFFICIENT: _efficient_reason, CUDNN: _cudnn_reason}


def choose_backend(
    q, k, v, attn_mask, dropout_p: float, is_causal: bool, enable_gqa: bool, target: SdpaTarget
) -> tuple[str, tuple[str, ...]]:
    """The backend the target would run, and why each earlier one in the order was passed over."""
    enabled = _enabled()
    rejected: list[str] = []
    for backend in priority_order(target):
        if not enabled[backend]:
            rejected.append(f"{backend}: disabled")
            continue
        if backend == MATH:
            return MATH, tuple(rejected)
        reason = _REASONS[backend](q, k, v, attn_mask, dropout_p, is_causal, enable_gqa, target)
        if reason is None:
            return backend, tuple(rejected)
        rejected.append(f"{backend}: {reason}")
    raise RuntimeError(
        "no SDPA backend the target GPU would run accepts this call ("
        + "; ".join(rejected)
        + "); the GPU run would fail the same way"
    )


def _float_mask(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    # convert_boolean_attn_mask: a boolean mask becomes a new additive mask in the query dtype
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(
        mask.logical_not(), torch.full((), float("-inf"), dtype=dtype), torch.zeros((), dtype=dtype)
    )


def _pad_last_dim(x: torch.Tensor, multiple: int) -> torch.Tensor:
    size = x.shape[-1]
    if size % multiple == 0:
        return x
    return F.pad(x, (0, multiple - size % multiple))


def _efficient_mask(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # preprocess_mask: the kernel wants the key dim aligned to 16 elements, then a 4-d expand
    key_len = k.shape[2]
    if key_len % 16:
        mask = _pad_last_dim(mask, 16)[..., :key_len]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], key_len)


def run_backend(backend: str, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa):
    """Run ``backend``'s aten op (as the CUDA SDPA dispatcher calls it) and return the output."""
    aten = torch.ops.aten
    if backend == MATH:
        mask = _float_mask(attn_mask, q.dtype)
        return aten._scaled_dot_product_attention_math(
            q, k, v, mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa
        )[0]
    needs_grad = _requires_grad(q, k, v)
    if backend == FLASH:
        head_dim = q.shape[-1]
        qp, kp, vp = (_pad_last_dim(x, 8) for x in (q, k, v))
        out = aten._scaled_dot_product_flash_attention(
            qp,
            kp,
            vp,
            dropout_p,
            is_causal,
            False,
            scale=scale if scale is not None else head_dim**-0.5,
        )[0]
        return out[..., :head_dim] if out.shape[-1] != head_dim else out
    if backend == EFFICIENT:
        mask = _float_mask(attn_mask, q.dtype)
        if mask is not None:
            mask = _efficient_mask(mask, q, k)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, needs_grad, dropout_p, is_causal, scale=scale
        )[0]
    if backend == CUDNN:
        mask = _float_mask(attn_mask, q.dtype)
        if mask is not None:
            mask = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
        return aten._scaled_dot_product_cudnn_attention(
            q, k, v, mask, needs_grad, dropout_p, is_causal, False, scale=scale
        )[0]
    raise ValueError(f"unknown SDPA backend {backend!r}")


def describe(backend: str, q, k, v, attn_mask, is_causal, enable_gqa, rejected) -> SdpaCall:
    """The record of one call."""
    return SdpaCall(
        backend=backend,
        query_shape=tuple(q.shape),
        key_shape=tuple(k.shape),
        dtype=str(q.dtype).removeprefix("torch."),
        has_mask=attn_mask is not None,
        is_causal=bool(is_causal),
        enable_gqa=bool(enable_gqa),
        requires_grad=_requires_grad(q, k, v),
        rejected=rejected,
    )
