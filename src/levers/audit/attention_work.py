"""The work of one attention call, unfused (MATH or eager) and fused (flash-style), as Parts.

Legend: B batch, Hq query heads, Hkv key/value heads, Lq and Lk sequence lengths, D head_dim,
S = B * Hq * Lq * Lk (the elements of the score matrix).

The MATH backend upcasts fp16/bf16 inputs to fp32, repeats key/value heads for grouped-query
attention, and materialises the scores several times (q·kᵀ, + mask, softmax), then reads them
for p·v; its backward reads and writes score-sized tensors again. A fused kernel reads q, k, v
once and writes the output and a log-sum-exp; its backward recomputes the scores on chip
(2.5x the forward's FLOPs) without writing them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from levers.audit.cost.roofline import dtype_size
from levers.audit.finding import Part


@dataclass(frozen=True)
class AttnShape:
    batch: int
    heads_q: int
    heads_kv: int
    len_q: int
    len_k: int
    head_dim: int
    dtype: str
    has_mask: bool = False
    is_causal: bool = False
    requires_grad: bool = True

    @property
    def scores(self) -> int:
        return self.batch * self.heads_q * self.len_q * self.len_k

    def qkvo_bytes(self, size: int) -> int:
        q = self.batch * self.heads_q * self.len_q * self.head_dim
        kv = 2 * self.batch * self.heads_kv * self.len_k * self.head_dim
        return (2 * q + kv) * size  # q and the output, k and v


def math_parts(shape: AttnShape, *, tf32: bool) -> tuple[Part, ...]:
    """The MATH backend's kernels for one call, forward and (when training) backward."""
    f32 = 4
    s = shape.scores
    d = shape.head_dim
    in_size = dtype_size(shape.dtype)
    upcast_bytes = shape.qkvo_bytes(in_size) + shape.qkvo_bytes(f32)
    repeat_bytes = 0
    if shape.heads_kv != shape.heads_q:
        repeat_bytes = 2 * 2 * shape.batch * shape.heads_q * shape.len_k * d * f32
    mask_passes = 3 if shape.has_mask else 0
    parts = [
        Part(
            "math forward: casts, scale, repeat k/v",
            bytes=upcast_bytes + repeat_bytes,
            num_kernels=6,
        ),
        Part(
            "math forward: q·kᵀ",
            flops=2 * s * d,
            bytes=s * f32,
            num_kernels=1,
            dtype="float32",
            tf32=tf32,
        ),
        Part(
            "math forward: mask and softmax",
            bytes=(mask_passes + 2) * s * f32,
            num_kernels=2 + (1 if shape.has_mask else 0),
        ),
        Part(
            "math forward: p·v",
            flops=2 * s * d,
            bytes=s * f32,
            num_kernels=1,
            dtype="float32",
            tf32=tf32,
        ),
    ]
    if shape.requires_grad:
        parts += [
            Part(
                "math backward: dp, dv",
                flops=4 * s * d,
                bytes=3 * s * f32,
                num_kernels=2,
                dtype="float32",
                tf32=tf32,
            ),
            Part("math backward: softmax", bytes=3 * s * f32, num_kernels=1),
            Part(
                "math backward: dq, dk",
                flops=4 * s * d,
                bytes=2 * s * f32,
                num_kernels=2,
                dtype="float32",
                tf32=tf32,
            ),
            Part(
                "math backward: casts, reduce k/v heads",
                bytes=upcast_bytes + repeat_bytes,
                num_kernels=6,
            ),
        ]
    return tuple(parts)


def fused_parts(
    shape: AttnShape, *, label: str, slowdown: float = 1.0
) -> tuple[Part, ...]:
    """A flash-style kernel for one call; ``slowdown`` > 1 for a less efficient fused kernel."""
    size = dtype_size(shape.dtype)
    flops = 4 * shape.scores * shape.head_dim
    if shape.is_causal:
        flops //= 2
    io = shape.qkvo_bytes(size)
    lse = shape.batch * shape.heads_q * shape.len_q * 4
    parts = [
        Part(
            f"{label} forward",
            flops=int(flops * slowdown),
            bytes=io + lse,
            num_kernels=1,
            dtype=shape.dtype,
        )
    ]
    if shape.requires_grad:
        parts.append(
            Part(
                f"{label} backward",
                flops=int(2.5 * flops * slowdown),
                bytes=2 * io + lse,
                num_kernels=3,
                dtype=shape.dtype,
            )
        )
    return tuple(parts)


def scores_saved_bytes(shape: AttnShape) -> int:
    """Bytes of fp32 probabilities the unfused path keeps for backward, per call."""
    return shape.scores * 4 if shape.requires_grad else 0
