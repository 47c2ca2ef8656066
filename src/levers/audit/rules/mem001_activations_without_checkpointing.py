"""MEM001 activations-without-checkpointing: the peak is dominated by activations kept for backward.

## What it does
When no activation checkpointing runs in the step, measures how much of the peak is activations
(live bytes at the end of the forward pass minus the start of the step), by module, and states
the headroom that per-block checkpointing of each family of repeated blocks (`text.layers.*`,
`vision.blocks.*`) would buy. The headroom is **predicted by levers memory** when the audit
has the memory model's prediction of the step on the target GPU (`levers audit` makes one
unless `--no-memory-model`): the drop of the predicted allocated and reserved peaks when every
block runs under checkpointing (its activation-checkpointing what-if). Without a prediction, or
when the what-if could not be predicted, it is a **timeline estimate** from the capture's
live-bytes timeline, and says so. It fires when activations are at least half of what the step
adds to memory above its start (parameters, gradients and optimizer state) and the headroom is
at least 5% of the activations (the predicted activations at the predicted peak, when the
headroom is predicted). When the prediction says checkpointing buys less than that at the
audited size (a small step whose peak is set by kernel workspaces), it still reports the
pattern, at low severity, with the predicted figure and that note.

It recommends checkpointing only when memory binds (the bottleneck section's bound: the step
does not fit, or leaves under 10% of the GPU free), or when checkpointing plus the larger batch
it makes room for is predicted to raise tokens/s over the largest batch that fits without it
(levers memory's fit, and a first-order step-time model: the optimizer and launch gaps stay,
the rest and the recomputation scale with the batch). Otherwise the finding says it is not
recommended, with those numbers, and ranks after the findings that are.

## Why is this bad?
Every block keeps its intermediate activations alive until backward. Checkpointing keeps only
each block's input and recomputes the rest during backward, one block at a time: memory that
buys batch size, which usually nets positive throughput despite the recomputation (about one
extra forward of the checkpointed blocks).

## Example
```python
for block in self.blocks:
    x = block(x)
```

Use instead:
```python
for block in self.blocks:
    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
```

## Fix
Lever `ac-budget` with the budget that fits: the memory model's usable memory on the target GPU
less its 5% margin (`--lever ac-budget:budget=<that>GiB`), the fastest
checkpointing plan whose predicted peak fits there (docs/activation-checkpointing.md); then
re-tune the batch size into the freed memory (`raise-batch`). Without a memory-model
prediction, `ac-full` (every block, non-reentrant); `ac-selective` recomputes only the cheap ops.

## Fix safety
Exact: recomputation reproduces the forward bitwise for deterministic ops (dropout restores its
RNG state).

## Known problems
Whether it fires, and the activations by module, come from the capture's live-bytes timeline
(tracked tensor storages on a CPU, the allocator on a GPU); on a CPU capture run in float32 they
are float32 bytes, while the memory model predicts the GPU run (bf16 autocast where the
workload uses it), so the two sets of figures differ. The predicted headroom is the allocated
peak's drop; the reserved peak moves in allocator segments (2 or 20 MiB), so on a small step it
may not move at all. The timeline estimate is first-order: it assumes each block's input is its
predecessor's output. The block call line is found by reading the source for a loop over the
blocks' ModuleList attribute.

## References
- https://pytorch.org/docs/stable/checkpoint.html
- Chen et al., Training Deep Nets with Sublinear Memory Cost (2016), https://arxiv.org/abs/1604.06174
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace

from levers.capture.records import Capture
from levers.audit.activations import (
    ActivationProfile,
    BlockFamily,
    activation_profile,
)
from levers.audit.block_calls import block_call_sites
from levers.audit.bottleneck import MEMORY_BOUND, Bottleneck, step_bottleneck, tokens_per_s_ratio
from levers.audit.config import PredictedMemory, RuleConfig
from levers.audit.cost import roofline
from levers.audit.finding import AlreadyRight, Finding, Receipt, Work
from levers.audit.patterns import fmt_bytes, receipt
from levers.audit.rules.registry import registered, rule
from levers.vocab import EXACT

CODE, NAME = "MEM001", "activations-without-checkpointing"
# activations must be at least this share of the peak above the step's starting memory
# (parameters, gradients, optimizer state): the dynamic term checkpointing acts on
MIN_ACTIVATION_SHARE = 0.5
# and the headroom at least this share of the activations
MIN_HEADROOM_SHARE = 0.05
# a headroom of at least this share of the peak is a high-severity finding
HIGH_HEADROOM_SHARE = 0.1
PREDICTED, TIMELINE = "levers memory", "capture timeline"
# a what-if's failure note can be a multi-line torch error: its first line, this long, is enough
MAX_NOTE_CHARS = 120
# the share of usable memory the budget keeps free (levers memory's default margin)
BUDGET_MARGIN = 0.05


@dataclass(frozen=True)
class Headroom:
    """What checkpointing would free, and where the figure comes from."""

    source: str  # PREDICTED or TIMELINE
    freed_bytes: int  # the peak's drop (allocated, for a prediction)
    activation_bytes: int  # the activations the headroom is a share of
    peak_bytes: int  # the peak the headroom is a share of
    statement: str  # the sentence of the message that states it


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """Activation checkpointing on, with the ops it recomputes."""
    if not capture.settings.get("activation_checkpointing"):
        return None
    recomputed = sum(1 for op in capture.ops if op.recompute)
    return AlreadyRight(
        "MEM001",
        "activation checkpointing on",
        f"{recomputed} ops recomputed in backward",
    )


@rule(
    CODE, NAME, severity="medium", fix_safety=EXACT, levers=("ac-budget", "ac-full", "ac-selective"),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    # checkpointing already runs: the headroom is taken
    if capture.settings.get("activation_checkpointing"):
        return
    profile = activation_profile(capture)
    # no live-bytes timeline, or no repeated blocks to checkpoint
    if profile is None or not profile.families:
        return
    dynamic = profile.peak_bytes - profile.start_bytes
    # activations do not dominate what the step adds to memory
    if dynamic <= 0 or profile.activation_bytes < MIN_ACTIVATION_SHARE * dynamic:
        return
    families = _families_to_report(profile)
    headroom = _headroom(profile, families, config.memory)
    worth_it = headroom.freed_bytes >= MIN_HEADROOM_SHARE * headroom.activation_bytes
    # a timeline estimate this small is noise: say nothing
    if not worth_it and headroom.source == TIMELINE:
        return
    # a prediction that checkpointing buys nothing at this size is still worth saying (the
    # pattern is there and the answer changes with batch and sequence): reported at low severity
    finding = _finding(profile, families, headroom, capture, config.memory, worth_it=worth_it)
    yield _with_verdict(finding, capture, config, headroom)


def _recompute_ms(finding: Finding, capture: Capture, config: RuleConfig) -> float:
    """The recomputation checkpointing adds per step (device time, or the roofline estimate)."""
    ops = [capture.ops[i] for i in finding.work.fixed_extra_ops]
    if config.on_gpu and any(op.device_us is not None for op in ops):
        return sum(op.device_us or 0.0 for op in ops) / 1e3
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    return roofline.ops_us(ops, config.gpu, assumed_dtype=config.assumed_dtype, tf32=tf32) / 1e3


def checkpointed_fit(memory: PredictedMemory, freed_bytes: int) -> int | None:
    """The batch that fits with checkpointing: linear in the predicted activations per sample."""
    if not memory.batch_now or memory.batch_fit is None or memory.activation_bytes <= 0:
        return None
    per_sample_ac = max(memory.activation_bytes - freed_bytes, 0) / memory.batch_now
    fixed = memory.peak_reserved_bytes - memory.activation_bytes
    if per_sample_ac <= 0:
        return None
    fit = max(int((memory.fit_budget_bytes - fixed) // per_sample_ac), memory.batch_now)
    # the fit without checkpointing stopped at a cap: the same cap holds with it, so both sides
    # of the comparison are computed the same way
    return fit if memory.batch_fit_cap is None else min(fit, memory.batch_fit_cap)


def _with_verdict(
    finding: Finding, capture: Capture, config: RuleConfig, headroom: Headroom
) -> Finding:
    """Recommend checkpointing only where memory binds or it is predicted to buy tokens/s."""
    b: Bottleneck = step_bottleneck(capture, config)
    memory = config.memory
    # memory binds: checkpointing is the lever it always was
    if b.bound == MEMORY_BOUND:
        return replace(finding, details={**finding.details, "recommended": True, "bound": b.bound})
    # nothing says memory binds (a script's capture, no prediction): said, at low severity
    if memory is None or b.bound != "throughput-bound":
        return replace(
            finding,
            message=finding.message + " Memory is not known to bind here (no prediction of the "
            "step on the GPU): checkpoint only if the step runs out of memory or a larger batch "
            "is wanted.",
            severity="low",
            details={**finding.details, "recommended": False, "bound": b.bound},
        )
    recompute = _recompute_ms(finding, capture, config)
    fit_ac = checkpointed_fit(memory, headroom.freed_bytes)
    verdict = {"bound": b.bound, "recompute_ms": recompute}
    text = (
        f" Not recommended: the step is throughput-bound ({fmt_bytes(memory.usable_bytes - memory.peak_reserved_bytes)} "
        f"free on {memory.gpu}), and checkpointing adds about {recompute:.3g} ms of recomputation "
        f"to the {b.step_ms:.3g} ms step ({b.provenance})"
    )
    recommended = False
    if memory.batch_fit is not None and fit_ac is not None and memory.batch_now:
        plain = tokens_per_s_ratio(b, memory.batch_now, memory.batch_fit)
        with_ac = tokens_per_s_ratio(b, memory.batch_now, fit_ac, extra_ms_now=recompute)
        recommended = with_ac > plain
        verdict.update(
            batch_fit=memory.batch_fit, batch_fit_checkpointed=fit_ac,
            tokens_per_s_ratio_fit=plain, tokens_per_s_ratio_checkpointed=with_ac,
        )
        text += (
            f"; without it {memory.batch_param}={memory.batch_fit}"
            f"{f' or more ({memory.batch_fit_note})' if memory.batch_fit_note else ''} fits ({plain:.2f}x tokens/s), "
            f"with it about {memory.batch_param}={fit_ac} ({with_ac:.2f}x, predicted"
            + (", at the same cap" if memory.batch_fit_cap is not None else "")
            + ")"
        )
    if recommended:
        return replace(
            finding,
            message=finding.message + text.replace(" Not recommended:", " Recommended with a larger batch:") + ".",
            details={**finding.details, **verdict, "recommended": True},
        )
    return replace(
        finding,
        message=finding.message + text + ". Keep the activations: the memory is free anyway.",
        severity="low",
        details={**finding.details, **verdict, "recommended": False},
    )


def _families_to_report(profile: ActivationProfile) -> tuple[BlockFamily, ...]:
    freeing = tuple(f for f in profile.families if f.headroom_bytes > 0)
    return freeing or profile.families


def _headroom(
    profile: ActivationProfile,
    families: tuple[BlockFamily, ...],
    memory: PredictedMemory | None,
) -> Headroom:
    # a prediction with no activations at its peak says nothing about checkpointing (e.g. a
    # factory without a device parameter builds on the CPU, outside the stand-in GPU)
    if (
        memory is not None
        and memory.checkpointing_applicable
        and memory.activation_bytes > 0
    ):
        return _predicted_headroom(memory, families)
    return _timeline_headroom(profile, families, memory)


def _blocks(families: tuple[BlockFamily, ...]) -> str:
    return ", ".join(f"{f.name} ({f.num_blocks} blocks)" for f in families)


def _predicted_headroom(
    memory: PredictedMemory, families: tuple[BlockFamily, ...]
) -> Headroom:
    freed_allocated = max(-memory.checkpointing_delta_allocated_bytes, 0)
    freed_reserved = max(-memory.checkpointing_delta_reserved_bytes, 0)
    reserved_after = memory.peak_reserved_bytes - freed_reserved
    statement = (
        f"Per-block checkpointing of {_blocks(families)} would lower the allocated peak by "
        f"{fmt_bytes(freed_allocated)} ({freed_allocated / max(memory.peak_allocated_bytes, 1):.0%}, "
        f"from {fmt_bytes(memory.peak_allocated_bytes)}) and the "
        f"reserved peak by {fmt_bytes(freed_reserved)} (to {fmt_bytes(reserved_after)} of "
        f"{fmt_bytes(memory.usable_bytes)} usable), predicted by levers memory for {memory.gpu} "
        f"({memory.checkpointing_note}; activations at the predicted peak: "
        f"{fmt_bytes(memory.activation_bytes)}), for one extra forward of those blocks."
    )
    return Headroom(
        source=PREDICTED,
        freed_bytes=freed_allocated,
        activation_bytes=memory.activation_bytes,
        peak_bytes=memory.peak_allocated_bytes,
        statement=statement,
    )


def _timeline_headroom(
    profile: ActivationProfile,
    families: tuple[BlockFamily, ...],
    memory: PredictedMemory | None,
) -> Headroom:
    freed = profile.headroom_bytes
    if memory is None:
        why = "no memory-model prediction"
    elif memory.checkpointing_applicable:
        why = (
            f"levers memory predicts no activations live at its "
            f"{fmt_bytes(memory.peak_allocated_bytes)} allocated peak on {memory.gpu}"
        )
    else:
        lines = memory.checkpointing_note.strip().splitlines()
        reason = lines[0].removeprefix("failed: ") if lines else "no reason given"
        why = (
            f"levers memory predicted the step, a {fmt_bytes(memory.peak_reserved_bytes)} "
            f"reserved peak on {memory.gpu}, but not its checkpointing what-if: "
            f"{reason[:MAX_NOTE_CHARS]}"
        )
    statement = (
        f"Per-block checkpointing of {_blocks(families)} would free about {fmt_bytes(freed)} "
        f"({freed / profile.peak_bytes:.0%} of the captured peak), a timeline estimate from the "
        f"capture ({why}), for one extra forward of those blocks."
    )
    return Headroom(
        source=TIMELINE,
        freed_bytes=freed,
        activation_bytes=profile.activation_bytes,
        peak_bytes=profile.peak_bytes,
        statement=statement,
    )


def _budget(memory: PredictedMemory) -> str:
    """The largest budget that fits, as ac-budget reads it: usable memory less the margin,
    rounded down to 0.1 GiB (to whole MiB under 1 GiB)."""
    budget_bytes = memory.usable_bytes * (1 - BUDGET_MARGIN)
    if budget_bytes >= 2**30:
        return f"{int(budget_bytes / 2**30 * 10) / 10:g}GiB"
    return f"{int(budget_bytes / 2**20)}MiB"


def _lever_spec(memory: PredictedMemory | None) -> str:
    if memory is None or not memory.checkpointing_applicable:
        return "ac-full"
    return f"ac-budget:budget={_budget(memory)}"


def _recommendation(memory: PredictedMemory | None) -> tuple[str, str]:
    """The lever id and the fix title: the fastest plan within the memory that fits, when
    levers memory predicted the step; every block otherwise."""
    if memory is None or not memory.checkpointing_applicable:
        return "ac-full", (
            "Checkpoint each block (lever ac-full: torch.utils.checkpoint, use_reentrant=False), "
            "then raise the batch size"
        )
    return "ac-budget", (
        f"Checkpoint within the {_budget(memory)} that fit on {memory.gpu} (lever "
        f"{_lever_spec(memory)}: the fastest plan under that peak), then raise the batch size"
    )


def _receipts(
    families: tuple[BlockFamily, ...], capture: Capture, source: str
) -> tuple[Receipt, ...]:
    files = {
        op.source.file
        for op in capture.ops
        if op.source is not None and not op.source.file.startswith("<")
    }
    receipts = []
    for fam in families:
        sites = block_call_sites(files, fam.attribute)
        first = capture.ops[fam.first_op]
        shapes = f"{fmt_bytes(fam.activation_bytes)} of activations"
        if source == TIMELINE:
            # the prediction wraps every family at once: no per-family figure to show
            shapes += f", ~{fmt_bytes(fam.headroom_bytes)} freed"
        common = {
            "module": fam.name,
            "op": f"{fam.num_blocks} blocks",
            "shapes": shapes,
            "count": fam.num_blocks,
        }
        if sites:
            receipts.extend(receipt(site, **common) for site in sites)
        else:
            receipts.append(receipt(first.source, **common))
    return tuple(receipts)


def _finding(
    profile: ActivationProfile,
    families: tuple[BlockFamily, ...],
    headroom: Headroom,
    capture: Capture,
    memory: PredictedMemory | None,
    *,
    worth_it: bool = True,
) -> Finding:
    peak = profile.peak_bytes
    acts = profile.activation_bytes
    groups = ", ".join(
        f"{name} {fmt_bytes(b)}"
        for name, b in list(profile.by_group.items())[:4]
        if b > 0
    )
    message = (
        f"No activation checkpointing: activations are {fmt_bytes(acts)} of the "
        f"{fmt_bytes(peak)} captured peak ({acts / peak:.0%}; "
        f"{acts / max(peak - profile.start_bytes, 1):.0%} of what the step adds to its starting "
        f"{fmt_bytes(profile.start_bytes)}); by module: {groups}. {headroom.statement}"
    )
    if not worth_it:
        message += (
            " At this size that is under 5% of the activations: fixed costs (kernel workspaces, "
            "parameters, optimizer state) set the peak, so checkpointing does not pay yet; the "
            "activations grow with batch and sequence length, so audit again at the training size."
        )
    high = headroom.freed_bytes >= HIGH_HEADROOM_SHARE * headroom.peak_bytes
    lever, fix_title = _recommendation(memory)
    return registered(CODE).finding(
        message=message,
        fix_title=fix_title,
        receipts=_receipts(families, capture, headroom.source),
        severity="low" if not worth_it else "high" if high else "medium",
        effort="S",
        risk="low",
        lever=lever,
        work=Work(
            now=(),
            fixed=(),
            now_ops=(),
            fixed_extra_ops=tuple(i for f in families for i in f.forward_ops),
            saved_bytes=headroom.freed_bytes,
        ),
        details={
            "levers": ["ac-full", "ac-selective", "ac-budget"],
            "activation_bytes": acts,
            "peak_bytes": peak,
            "by_module": profile.by_group,
            "headroom_source": headroom.source,
            "headroom_bytes": headroom.freed_bytes,
            "timeline_headroom_bytes": profile.headroom_bytes,
            "predicted": asdict(memory) if memory is not None else None,
            "recommended_lever": _lever_spec(memory),
            "families": {
                f.name: {
                    "blocks": f.num_blocks,
                    "activation_bytes": f.activation_bytes,
                    "headroom_bytes": f.headroom_bytes,
                }
                for f in profile.families
            },
        },
    )
