"""The per-rank peak of a data-parallel step: DDP, ZeRO-1 or FSDP2 on N ranks, from one rank's
prediction.

The single-rank step is predicted on fake tensors as usual (:mod:`levers.memory.predict`); its
allocated peak is split into the categories that distribution changes (parameters, gradients,
optimizer state) and the rest (activations, inputs, temporaries, workspaces, buffers), which
each rank keeps whole. Then, per strategy (``method`` = ``analytic``, as the plan says):

- ``ddp``: everything whole, plus DDP's reducer buckets: with ``gradient_as_bucket_view=False``
  (DDP's default) the reducer keeps a flat copy of every gradient, in buckets of
  ``bucket_cap_mb`` (25 MiB), allocated when DDP is built and alive for the whole run: the
  trainable parameters' bytes.
- ``zero1``: as DDP, with the optimizer state divided by N (``ZeroRedundancyOptimizer``).
- ``fsdp2``: parameters, gradients and optimizer state divided by N (``fully_shard`` on each
  repeated block and on the root), plus the unsharded parameters of the all-gathers in flight
  (the largest unit's, twice: the current unit and the one prefetched) and the unsharded
  gradients of one reduce-scatter (the largest unit's).

The FSDP units are the model's repeated blocks (:func:`levers.blocks.repeated_blocks`) and
the root (every parameter outside them), as the usual ``fully_shard`` recipe wraps them. The
reserved peak keeps the single rank's gap between reserved and allocated. Running DDP and FSDP2
themselves on fake tensors with a fake process group would measure these buffers instead of
modelling them; that is not done yet.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from levers.blocks import repeated_blocks
from levers.memory.plan import MemoryPlan
from levers.memory.prediction import Prediction, Source, plan_from, run_prediction

if TYPE_CHECKING:
    from levers.memory.options import MemoryOptions

STRATEGIES = ("ddp", "zero1", "fsdp2")
DEFAULT_BUCKET_CAP_MB = 25.0
MIB = 2**20
SHARDED = ("parameters", "gradients", "optimizer")
ALLGATHERS_IN_FLIGHT = 2  # the unit being computed and the one prefetched
METHOD = "analytic"


@dataclass(frozen=True)
class ModelBytes:
    """What the factory's model holds, read from it (on fake tensors) before the steps."""

    parameter_bytes: int
    trainable_bytes: int  # the gradients' bytes
    largest_unit: str  # "model.layers.0", or "(root)"
    largest_unit_bytes: int  # its parameters, unsharded
    num_units: int


@dataclass(frozen=True)
class RankMemory:
    """The predicted peak of one rank of ``world_size`` under ``strategy``."""

    strategy: str
    world_size: int
    method: str
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    single_peak_allocated_bytes: int
    single_peak_reserved_bytes: int
    by_category: dict[str, int]  # per rank: parameters, gradients, optimizer, other, and the
    # strategy's buffers (ddp_buckets, allgather_buffers, reduce_scatter_buffers)
    model: ModelBytes
    bucket_cap_mb: float
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def model_bytes(model: Any) -> ModelBytes:
    blocks = repeated_blocks(model)
    in_block: set[int] = set()
    units: list[tuple[str, int]] = []
    for block in blocks:
        params = list(block.module.parameters())
        in_block.update(id(p) for p in params)
        units.append((block.path, sum(p.numel() * p.element_size() for p in params)))
    params = list(model.parameters())
    root = sum(p.numel() * p.element_size() for p in params if id(p) not in in_block)
    if root:
        units.append(("(root)", root))
    name, largest = max(units, key=lambda u: u[1], default=("(root)", 0))
    return ModelBytes(
        parameter_bytes=sum(p.numel() * p.element_size() for p in params),
        trainable_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad),
        largest_unit=name,
        largest_unit_bytes=largest,
        num_units=len(units),
    )


def _shard(nbytes: int, world_size: int) -> int:
    return math.ceil(nbytes / world_size)


def per_rank(
    plan: MemoryPlan,
    model: ModelBytes,
    *,
    world_size: int,
    strategy: str,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> RankMemory:
    """The per-rank peak under ``strategy`` from the single-rank ``plan``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    at_peak = {c.category: c.nbytes for c in plan.by_category}
    whole = {c: at_peak.get(c, 0) for c in SHARDED}
    other = plan.peak_allocated_bytes - sum(whole.values())
    rank = dict(whole, other=other)
    notes: list[str] = []
    if strategy in ("ddp", "zero1"):
        rank["ddp_buckets"] = model.trainable_bytes
        notes.append(
            f"DDP's reducer keeps a flat copy of the gradients ({model.trainable_bytes} bytes, in "
            f"buckets of {bucket_cap_mb:g} MiB); gradient_as_bucket_view=True would make the "
            "gradients views of it instead"
        )
    if strategy == "zero1":
        rank["optimizer"] = _shard(whole["optimizer"], world_size)
    if strategy == "fsdp2":
        for category in SHARDED:
            rank[category] = _shard(whole[category], world_size)
        rank["allgather_buffers"] = ALLGATHERS_IN_FLIGHT * model.largest_unit_bytes
        rank["reduce_scatter_buffers"] = model.largest_unit_bytes
        notes.append(
            f"{model.num_units} FSDP units (each repeated block and the root); the largest, "
            f"{model.largest_unit}, all-gathers {model.largest_unit_bytes} bytes unsharded, "
            "twice with prefetch, and reduce-scatters as much; all-gathers in the parameters' "
            "dtype (no MixedPrecisionPolicy)"
        )
    allocated = sum(rank.values())
    gap = plan.peak_reserved_bytes - plan.peak_allocated_bytes
    return RankMemory(
        strategy=strategy,
        world_size=world_size,
        method=METHOD,
        peak_allocated_bytes=allocated,
        peak_reserved_bytes=allocated + gap,
        single_peak_allocated_bytes=plan.peak_allocated_bytes,
        single_peak_reserved_bytes=plan.peak_reserved_bytes,
        by_category=rank,
        model=model,
        bucket_cap_mb=bucket_cap_mb,
        notes=tuple(notes),
    )


def predict_per_rank(
    source: Source, options: MemoryOptions
) -> tuple[Prediction, MemoryPlan, RankMemory]:
    """The single-rank prediction and plan, and the per-rank prediction on
    ``options.world_size`` ranks sharing the model by ``options.strategy``."""
    assert options.world_size is not None and options.strategy is not None, "one rank of none"
    seen: list[ModelBytes] = []
    prediction = run_prediction(
        source, options.gpu, num_steps=options.num_steps,
        transform=lambda w: seen.append(model_bytes(w.model)),
    )
    plan = plan_from(prediction, options.gpu, options.margin)
    rank = per_rank(plan, seen[0], world_size=options.world_size, strategy=options.strategy)
    return prediction, plan, rank
