"""MEM004 optimizer-state-peak: Adam's float32 moments are a large share of the step's peak memory.

## What it does
Reads the optimizer the capture recorded after the step: when it is `torch.optim.Adam` or
`AdamW` (without amsgrad, maximize or differentiable, which the levers refuse) and every moment
it keeps is float32, it compares the moments with the step's allocated peak: the memory model's
prediction of the step on the target GPU (its optimizer state at the predicted peak) when the
audit has one, else the capture's peak and the moments it recorded. It fires when the state is at
least 25% of that peak and at least 1 MiB, and reports the bytes each optimizer-state lever
frees: the drop of the predicted allocated peak (levers memory's `bf16-optimizer-states` and
`8bit-optimizer-states` what-ifs) when predicted, else the state's own shrinkage from the
recorded moment sizes (the what-ifs' arithmetic, :mod:`levers.adam_state`).

It recommends the levers only when memory binds (the bottleneck section's bound: the step does
not fit, or leaves under 10% of the GPU free): there the freed memory makes the step fit or buys
the batch a larger one. On a throughput-bound step the memory is free anyway (MEM003 raises the
batch into it without touching the optimizer) and the levers change numerics for nothing, and
where the bound is unknown (no prediction) nothing says they are needed: the finding says so, is
not recommended, and ranks after those that are. It stays quiet where DIST004 fires (a DDP
step over 2 ranks or more whose state sharding would free a MiB per rank): sharding the state is
exact, the smaller state is not.

## Why is this bad?
AdamW keeps two float32 moments per parameter, 8 bytes, twice the float32 parameters and twice
their gradients: with activations checkpointed or small, the moments are the largest single
item at the peak. Kept in bf16 they take 4 bytes per parameter; quantized to 8 bits, block-wise,
about 2. The memory freed fits a model that did not fit, or a larger batch.

## Example
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)  # 8 bytes of state per parameter
```

Use instead:
```python
import levers

with levers.apply(model, "adamw-bf16-state", optimizer=optimizer):  # 4 bytes per parameter
    train(model, optimizer)
```

## Fix
Lever `adamw-bf16-state` (the moments in bf16, stochastically rounded: half the state), the one
the recommended stack takes; lever `adamw-8bit` (torchao's AdamW8bit: about a quarter) frees
more and quantizes more. `levers memory` predicts the peak with each (its what-ifs
`bf16-optimizer-states` and `8bit-optimizer-states`). Under DDP, shard the state first (DIST004: exact).

## Fix safety
Changes numerics: bf16 moments keep 8 mantissa bits (stochastic rounding keeps them unbiased),
8-bit moments a block-wise quantization. Prove it with `levers ab`'s held-out loss over 500
steps or more (its quality read), not with a few steps' loss.

## Known problems
The state is counted after the captured step (it is created lazily on the first step); a
capture of the first step sees none. Without a prediction the share is of the capture's peak:
on a CPU capture run in float32 the activations are float32 bytes, so the share is of a peak
larger or smaller than the GPU's. The freed bytes without a prediction are the state's
shrinkage, an upper bound of the peak's drop. The levers are checked with a single process;
under FSDP2 the state is each rank's shard, and they are not tested on DTensor parameters.

## References
- https://pytorch.org/docs/stable/generated/torch.optim.AdamW.html
- Dettmers et al., 8-bit Optimizers via Block-wise Quantization (2022), https://arxiv.org/abs/2110.02861
- Zamirai et al., Revisiting BFloat16 Training (2020), https://arxiv.org/abs/2010.06192
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

from levers.adam_state import (
    BF16_STATE_LEVER,
    INT8_STATE_LEVER,
    bf16_freed_bytes,
    int8_freed_bytes,
)
from levers.audit.bottleneck import MEMORY_BOUND, THROUGHPUT_BOUND, step_bottleneck
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Receipt, Work
from levers.audit.patterns import fmt_bytes
from levers.audit.rules.registry import registered, rule
from levers.audit.scale import MIN_SHARDING_SAVED_BYTES, model_call_receipt, sharding_saved_bytes
from levers.capture.records import Capture
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "MEM004", "optimizer-state-peak"
# the optimizers the levers take (exactly torch.optim.Adam and AdamW)
ADAM_CLASSES = ("Adam", "AdamW")
# options the levers refuse (levers.levers._optimizer_state.reason)
REFUSED_OPTIONS = ("amsgrad", "maximize", "differentiable")
# the moments must be at least this share of the allocated peak: AdamW's fp32 moments are 8
# bytes per parameter against 8 for the fp32 parameters and gradients, so a quarter means
# activations and the rest no larger than 16 bytes per parameter (a checkpointed or short-
# sequence step, a fine-tune), where halving the moments frees an eighth of the peak or more
MIN_PEAK_SHARE = 0.25
# and at least a MiB: below that the levers' compile time and numerics buy nothing
MIN_STATE_BYTES = 2**20
PREDICTED, CAPTURED = "levers memory", "capture"


@dataclass(frozen=True)
class StateShare:
    """The moments against the peak, and what each lever frees, with where the figures come from."""

    source: str  # PREDICTED or CAPTURED
    where: str  # the peak, in words: "captured peak", "predicted allocated peak on h100-80gb"
    state_bytes: int
    peak_bytes: int
    bf16_freed_bytes: int
    int8_freed_bytes: int


@rule(
    CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS,
    levers=(BF16_STATE_LEVER, INT8_STATE_LEVER),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    optimizer = capture.settings.get("optimizer") or {}
    cls = optimizer.get("class")
    # no optimizer, or one the levers do not take (SGD keeps no moments; others differ)
    if cls not in ADAM_CLASSES:
        return
    defaults = optimizer.get("defaults") or {}
    # an option the levers refuse: nothing they can do
    if any(defaults.get(option) for option in REFUSED_OPTIONS):
        return
    moments = dict(optimizer.get("moment_bytes") or {})
    # no moments recorded (the first step, or an older capture)
    if not moments.get("float32"):
        return
    # some moments are 16- or 8-bit already (bf16 parameters, or one of the levers holds them)
    if any(form != "float32" and nbytes for form, nbytes in moments.items()):
        return
    # DIST004 fires: sharding the state is the exact fix, and comes first
    if sharding_saved_bytes(capture) >= MIN_SHARDING_SAVED_BYTES:
        return
    share = _state_share(capture, config, optimizer)
    # too small to matter, or a small share of the peak
    if share.state_bytes < MIN_STATE_BYTES or share.state_bytes < MIN_PEAK_SHARE * share.peak_bytes:
        return
    yield _with_verdict(_finding(capture, cls, optimizer, share), capture, config)


def _state_share(capture: Capture, config: RuleConfig, optimizer: dict) -> StateShare:
    numels = [int(n) for n in optimizer.get("float32_moment_numels") or ()]
    recorded = int(optimizer["moment_bytes"]["float32"])
    memory = config.memory
    if (
        memory is not None
        and memory.optimizer_bytes > 0
        and memory.bf16_state_delta_allocated_bytes is not None
    ):
        int8 = memory.int8_state_delta_allocated_bytes
        return StateShare(
            source=PREDICTED,
            where=f"predicted allocated peak on {memory.gpu}",
            state_bytes=memory.optimizer_bytes,
            peak_bytes=memory.peak_allocated_bytes,
            bf16_freed_bytes=max(-memory.bf16_state_delta_allocated_bytes, 0),
            int8_freed_bytes=max(-int8, 0) if int8 is not None else 0,
        )
    return StateShare(
        source=CAPTURED,
        where="captured peak",
        state_bytes=recorded,
        peak_bytes=capture.memory.peak_bytes,
        bf16_freed_bytes=bf16_freed_bytes(numels),
        int8_freed_bytes=int8_freed_bytes(numels),
    )


def _receipt(capture: Capture, cls: str, optimizer: dict) -> Receipt:
    """The line that steps the optimizer (its update's first op with a user source line), else
    the model's first line."""
    shapes = f"{optimizer.get('num_params')} parameter tensors, float32 moments"
    source = next(
        (op.source for op in capture.ops if op.phase == "optimizer" and op.source is not None),
        None,
    )
    if source is None:
        return model_call_receipt(capture, op=f"{cls}.step", shapes=shapes)
    return Receipt(
        file=source.file, line=source.line, code=source.code, module=None,
        op=f"{cls}.step", shapes=shapes,
    )


def _finding(capture: Capture, cls: str, optimizer: dict, share: StateShare) -> Finding:
    frees = "lowers that peak by" if share.source == PREDICTED else "frees"
    int8 = (
        f"{INT8_STATE_LEVER} (torchao's AdamW8bit) {frees} {fmt_bytes(share.int8_freed_bytes)}"
        if share.int8_freed_bytes
        else f"{INT8_STATE_LEVER} frees nothing here (no moment of 4096 values or more in a "
        "multiple of 256, the ones torchao quantizes)"
    )
    message = (
        f"{cls} keeps its two moments in float32: {fmt_bytes(share.state_bytes)}, "
        f"{share.state_bytes / max(share.peak_bytes, 1):.0%} of the {fmt_bytes(share.peak_bytes)} "
        f"{share.where}. {BF16_STATE_LEVER} (bf16 moments) {frees} {fmt_bytes(share.bf16_freed_bytes)}; "
        f"{int8} ({share.source}). Both change numerics: prove with levers ab's held-out loss "
        "over >= 500 steps."
    )
    return registered(CODE).finding(
        message=message,
        fix_title=f"Keep {cls}'s moments in bf16 (lever {BF16_STATE_LEVER}), or in 8 bits "
        f"(lever {INT8_STATE_LEVER}); prove the loss with levers ab over >= 500 steps",
        receipts=(_receipt(capture, cls, optimizer),),
        effort="S",
        risk="medium",
        work=Work(saved_bytes=share.bf16_freed_bytes),
        details={
            "levers": [BF16_STATE_LEVER, INT8_STATE_LEVER],
            "class": cls,
            "state_bytes": share.state_bytes,
            "peak_bytes": share.peak_bytes,
            "source": share.source,
            "freed_bytes": {
                BF16_STATE_LEVER: share.bf16_freed_bytes,
                INT8_STATE_LEVER: share.int8_freed_bytes,
            },
        },
    )


def _with_verdict(finding: Finding, capture: Capture, config: RuleConfig) -> Finding:
    """Recommended only where memory binds; said, at low severity, otherwise."""
    b = step_bottleneck(capture, config)
    details = {**finding.details, "bound": b.bound}
    # memory binds: the freed memory makes the step fit, or buys a larger batch
    if b.bound == MEMORY_BOUND:
        return replace(
            finding,
            message=finding.message + f" Recommended: memory binds ({b.bound_reason}).",
            details={**details, "recommended": True},
        )
    if b.bound == THROUGHPUT_BOUND:
        why = (
            f" Not recommended: memory does not bind ({b.bound_reason}); raise the batch into "
            "the free memory first (MEM003), and shrink the state only when that runs out."
        )
    else:
        why = (
            " Not recommended: memory is not known to bind here (no prediction of the step on "
            "the GPU); shrink the state only if the step runs out of memory or a larger batch "
            "is wanted."
        )
    return replace(
        finding,
        message=finding.message + why,
        severity="low",
        details={**details, "recommended": False},
    )
