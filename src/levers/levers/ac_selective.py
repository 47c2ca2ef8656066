"""``ac-selective``: op-level selective checkpointing of every repeated block.

Each block runs under non-reentrant ``torch.utils.checkpoint`` with a selective policy: the
outputs of attention (the SDPA flash / efficient / cuDNN / CPU-flash ops) and of every other
matmul (``mm``, ``addmm``, ``bmm``, counted per block in order: the 1st, 3rd, 5th... are saved)
are kept for backward, everything else (norms, activations, RoPE, casts, the other matmuls) is
recomputed. Matmuls under ``mm_flops_threshold`` FLOPs are always recomputed and not counted:
recomputing a matmul costs n^3 while keeping its output costs n^2 bytes, so a small matmul is
cheap to run again per byte it would hold.

The default threshold and how it was derived: see ``docs/activation-checkpointing.md``.
Every matmul's shape, FLOPs and decision is logged once (``logging``, logger
``levers.levers.ac_selective``) and kept on the handle (``undo.handle.matmuls`` from
:func:`levers.levers.lever.apply`). Exact: saved outputs are the same tensors the recompute would
produce.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from torch.utils.checkpoint import CheckpointPolicy

from levers.levers import register
from levers.levers.checkpointing import blocks_or_reason, wrap_blocks
from levers.levers.lever import Lever, Target, Undo
from levers.levers.sac import ATTENTION, MATMULS, Policy, contexts, matmul_flops, op_name
from levers.vocab import EXACT

logger = logging.getLogger(__name__)

# Measured on the H200 (bench/results/ac_policies_h200/knee.json, bf16): from 2*m*k*n of an
# [8192 x 1536] @ [1536 x 1536] matmul (3.87e10 FLOPs) up, every matmul costs at least twice as
# much per byte of output to recompute as a memory-bound op writing the same bytes; below it
# recomputing is cheap per byte saved. See docs/activation-checkpointing.md.
DEFAULT_MM_FLOPS_THRESHOLD = 2 * 8192 * 1536 * 1536


@dataclass(frozen=True)
class MatmulDecision:
    block: str  # the first block it was seen in ("model.layers.0")
    op: str  # "aten.mm.default"
    occurrence: int  # its place among the block's matmuls, from 0
    shapes: tuple[tuple[int, ...], ...]  # operand shapes
    flops: int
    saved: bool
    reason: str  # "every other matmul: saved", "under the FLOP threshold: recomputed", ...


@dataclass
class SelectiveHandle:
    """The undo of ``ac-selective``, with what its policy decided."""

    undo: Undo
    mm_flops_threshold: int
    matmuls: list[MatmulDecision] = field(default_factory=list)

    def __call__(self) -> None:
        self.undo()


def every_other_matmul_policy(
    threshold: int, record: Any = None, block: str = ""
) -> Policy:
    """The policy for one checkpoint call; ``record(decision)`` gets each matmul's decision."""
    counts: dict[bool, int] = defaultdict(int)  # counted matmuls, in forward and recompute
    seen: dict[bool, int] = defaultdict(int)  # every matmul, for the log's occurrence

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        recompute = bool(ctx.is_recompute)
        if func in ATTENTION:
            return CheckpointPolicy.MUST_SAVE
        if func not in MATMULS:
            return CheckpointPolicy.PREFER_RECOMPUTE
        occurrence = seen[recompute]
        seen[recompute] += 1
        flops = matmul_flops(func, args)
        if flops < threshold:
            saved, reason = False, "under the FLOP threshold: recomputed"
        else:
            counts[recompute] += 1
            saved = counts[recompute] % 2 == 1
            reason = "every other matmul: " + ("saved" if saved else "recomputed")
        if record is not None and not recompute:
            shapes = tuple(tuple(a.shape) for a in args if hasattr(a, "shape"))
            record(MatmulDecision(block, op_name(func), occurrence, shapes, flops, saved, reason))
        return CheckpointPolicy.MUST_SAVE if saved else CheckpointPolicy.PREFER_RECOMPUTE

    return policy


def checkpoint_selective(
    model: Any, mm_flops_threshold: int = DEFAULT_MM_FLOPS_THRESHOLD
) -> SelectiveHandle:
    """Checkpoint every repeated block of ``model`` with the every-other-matmul policy."""
    blocks, reason = blocks_or_reason(model)
    if reason is not None:
        raise ValueError(f"ac-selective cannot apply: {reason}")
    handle = SelectiveHandle(undo=lambda: None, mm_flops_threshold=int(mm_flops_threshold))
    logged: set[tuple[str, int, tuple]] = set()

    def record(decision: MatmulDecision) -> None:
        key = (decision.op, decision.occurrence, decision.shapes)
        if key in logged:  # once per matmul of the block, not once per block and step
            return
        logged.add(key)
        handle.matmuls.append(decision)
        logger.info(
            "ac-selective: %s #%d %s: %.3g FLOPs, %s",
            decision.op,
            decision.occurrence,
            " x ".join(str(list(s)) for s in decision.shapes),
            decision.flops,
            decision.reason,
        )

    def context_fn_for(position: int, block: Any) -> Any:
        return lambda: contexts(
            lambda: every_other_matmul_policy(handle.mm_flops_threshold, record, block.path)
        )

    handle.undo = wrap_blocks(model, blocks, context_fn_for)
    return handle


def applies(target: Target) -> str | None:
    return blocks_or_reason(target.model)[1]


def _threshold(options: dict[str, Any]) -> int:
    raw = options.get("mm_flops_threshold", DEFAULT_MM_FLOPS_THRESHOLD)
    try:
        value = int(float(raw))
    except (TypeError, ValueError, OverflowError):
        raise ValueError(
            f"ac-selective: mm_flops_threshold must be a number of FLOPs (e.g. 1e9), got {raw!r}"
        ) from None
    if value < 0:
        raise ValueError(f"ac-selective: mm_flops_threshold must be >= 0, got {raw!r}")
    return value


def check(options: dict[str, Any]) -> None:
    _threshold(options)


def patch(target: Target) -> Undo:
    return checkpoint_selective(target.model, _threshold(target.options))


LEVER = register(
    Lever(
        id="ac-selective",
        title=(
            "Checkpoint the repeated blocks selectively: keep attention and every other large "
            "matmul, recompute the rest"
        ),
        safety=EXACT,
        fixes=("MEM001",),
        applies=applies,
        patch=patch,
        options=("mm_flops_threshold",),
        check=check,
    )
)
