"""MOE001 experts-loop: a mixture of experts runs its experts as one small matmul per expert.

## What it does
Finds the experts modules of a mixture of experts (the audit's `experts` op class: a module whose
class name ends in `Experts`, as transformers names them, `MixtralExperts`, `Qwen2MoeExperts`,
..., or a module named `experts`, such as an `nn.ModuleList` of expert MLPs) whose forward ran
at least 4 matmuls (mm, addmm, linear, matmul) in the step and no grouped matmul
(`_grouped_mm`): the experts loop, one matmul per expert and projection, as transformers'
`experts_implementation="eager"` runs them. It reports the matmuls per step (forward and
backward), their share of the step's FLOPs, the host syncs the loop made inside the experts
modules (reading which experts got tokens: `nonzero`, `torch.where`, a tensor's `bool` per
expert) and, on a GPU capture, the experts' share of the step's device time (measured). The
receipts are the loop's matmul lines.

## Why is this bad?
Each expert gets the few tokens the router sent it, so each matmul is small, and the loop
launches a matmul, gathers and scatters per expert and projection; it waits on the device each
time it reads which experts got tokens. A grouped GEMM (`torch._grouped_mm`, sm80 and later)
sorts the tokens by expert and runs each projection of every expert in one kernel, with no host
read. On an H200 the zoo's ~0.8e9-parameter Mixtral trained 1.52x the tokens/s with transformers'
grouped matmuls over its loop (bench/results/moe_h200/README.md).

## Example
```python
model = AutoModelForCausalLM.from_pretrained(name, experts_implementation="eager")
```

Use instead:
```python
model = AutoModelForCausalLM.from_pretrained(name)  # transformers' default: grouped_mm
# or, on a model built with the loop:
model.set_experts_implementation("grouped_mm")
```

## Fix
Lever `experts-grouped-mm` on a Hugging Face model (`set_experts_implementation("grouped_mm")`,
undone by setting back what it was). Experts written in your own code: sort the tokens by
expert and call `torch._grouped_mm` (`F.grouped_mm` on torch 2.10+) once per projection, with
the experts' weights stacked in one 3-D parameter.

## Fix safety
Changes numerics: the grouped kernel sums in another order and the tokens are reordered (1e-5
relative in fp32, checked by the lever's test). Routing and parameters are unchanged.

## Known problems
The lever is named only for transformers' experts (an `*Experts` module whose matmuls' source
lines are in transformers); experts in your own code, or transformers 4's `nn.ModuleList` of
experts, get the finding with no lever, since the lever switches transformers 5's experts
interface. On a CPU capture the saving is the roofline's per-kernel cost of the kernels the
grouped form does not launch, which leaves out the host syncs and the small matmuls' low
efficiency (it under-promises: 1.52x was measured on an H200). The syncs counted are the calls
of the kinds SYNC001 reports that the capture saw inside the experts modules.

## References
- https://huggingface.co/docs/transformers/main/en/experts_interface
- https://docs.pytorch.org/docs/stable/generated/torch.nn.functional.grouped_mm.html
- Gale et al., MegaBlocks: Efficient Sparse Training with Mixture-of-Experts (2022), https://arxiv.org/abs/2211.15841
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.audit.bottleneck import EXPERTS, moe_modules, step_bottleneck
from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Part, Work
from levers.audit.patterns import (
    backward_index,
    base_name,
    collapse_module,
    group_by_source,
    meta_text,
    module_pattern,
    receipt,
    sum_bytes,
    sum_flops,
    with_backward,
)
from levers.audit.rules.registry import registered, rule
from levers.capture.records import Capture, OpRecord
from levers.vocab import CHANGES_NUMERICS, MEASURED

CODE, NAME = "MOE001", "experts-loop"
LEVER = "experts-grouped-mm"
# the class-name suffix of transformers' experts modules (MixtralExperts, Qwen2MoeExperts, ...),
# the ones whose implementation the lever switches
EXPERTS_SUFFIX = "Experts"
MATMULS = ("mm", "addmm", "linear", "matmul")
# in the op names of torch._grouped_mm and transformers' grouped_mm_fallback custom op
GROUPED = "grouped_mm"
# forward matmuls of one experts module per step: two experts of two projections make a loop;
# one expert's is a dense MLP
MIN_MATMULS = 4
# a grouped matmul runs one kernel forward and two backward (input and weight gradients)
KERNELS_PER_GROUPED_MM = 3
# the source files of transformers' experts (the lever switches only those)
TRANSFORMERS_PATH = "/transformers/"


def _in(path: str | None, root: str) -> bool:
    return path is not None and (path == root or path.startswith(root + "."))


def _experts_modules(capture: Capture) -> list[str]:
    """The experts modules (the bottleneck's: class name ending in ``Experts``, or named
    ``experts``), outermost only."""
    paths, _ = moe_modules(capture.modules)
    return sorted(p for p in paths if not any(_in(p, q) and p != q for q in paths))


@rule(CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=(LEVER,))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    roots = _experts_modules(capture)
    # no experts module: not a mixture of experts
    if not roots:
        return
    forward = [op for op in capture.ops if op.phase == "forward" and not op.recompute]
    looped: dict[str, list[OpRecord]] = {}
    for root in roots:
        inside = [op for op in forward if _in(op.module, root)]
        # grouped already: one kernel per projection (or transformers' grouped_mm fallback, whose
        # loop the lever cannot change)
        if any(GROUPED in op.name for op in inside):
            continue
        matmuls = [op for op in inside if base_name(op.name) in MATMULS]
        # one expert's worth of matmuls, or none: not a loop
        if len(matmuls) < MIN_MATMULS:
            continue
        looped[root] = matmuls
    # every experts module is grouped, or runs too few matmuls to be a loop
    if not looped:
        return
    yield _finding(capture, config, looped)


def _projection(op: OpRecord, root: str) -> tuple:
    """Which projection a per-expert matmul is: its source line, and the module under the
    expert's index (``0``, ``2`` in ``experts.3.0``, ``experts.3.2`` of an nn.ModuleList)."""
    parts = (op.module or root)[len(root) + 1:].split(".") if op.module != root else []
    if parts and parts[0].isdigit():
        parts = parts[1:]
    where = (op.source.file, op.source.line) if op.source is not None else ("", op.index)
    return (*where, ".".join(parts))


def _finding(capture: Capture, config: RuleConfig, looped: dict[str, list[OpRecord]]) -> Finding:
    forward = [op for ops in looped.values() for op in ops]
    indices = with_backward((op.index for op in forward), backward_index(capture))
    ops = [capture.ops[i] for i in indices]
    matmuls = [op for op in ops if base_name(op.name) in MATMULS]
    flops, total_flops = sum_flops(matmuls), sum_flops(capture.ops)
    projections = sum(
        len({_projection(op, root) for op in mms}) for root, mms in looped.items()
    )
    syncs = [
        c for c in capture.calls
        if c.kind == "sync" and any(_in(c.module, root) for root in looped)
    ]
    # the lever switches transformers' experts interface: an *Experts module of transformers
    hf = all(
        capture.modules.get(root, "").endswith(EXPERTS_SUFFIX) for root in looped
    ) and any(
        op.source is not None and TRANSFORMERS_PATH in op.source.file.replace("\\", "/")
        for op in forward
    )
    time = ""
    b = step_bottleneck(capture, config)
    if b.provenance == MEASURED:
        time = f"; the experts' ops took {b.of(EXPERTS).share:.0%} of its device time (measured)"
    modules = module_pattern(looped)
    message = (
        f"The experts of {len(looped)} mixture-of-experts module{'s' if len(looped) > 1 else ''} "
        f"({modules}) run one matmul per expert and projection: {len(forward)} matmuls forward "
        f"and {len(matmuls) - len(forward)} backward per step, {flops / max(total_flops, 1):.0%} "
        f"of the step's FLOPs, against {projections * KERNELS_PER_GROUPED_MM} grouped "
        f"matmuls for {projections} projections{time}"
        + (
            f"; the loop made {len(syncs)} host syncs reading which experts got tokens."
            if syncs
            else "."
        )
    )
    receipts = tuple(
        receipt(
            group[0].source,
            module=collapse_module(group[0].module),
            op=base_name(group[0].name),
            shapes=" x ".join(meta_text(m) for m in group[0].inputs if len(m.shape) == 2),
            count=len(group),
        )
        for group in group_by_source(forward, lambda op: op.source).values()
    )
    if hf:
        lever, fix_title = LEVER, (
            "Run the experts as grouped matmuls: set_experts_implementation(\"grouped_mm\") "
            f"(lever {LEVER})"
        )
    else:
        lever, fix_title = None, (
            "Sort the tokens by expert and run each projection as one torch._grouped_mm "
            "(F.grouped_mm), the experts' weights stacked in a 3-D parameter"
        )
    dtype = config.compute_dtype(forward[0].inputs[0].dtype) if forward[0].inputs else ""
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    moved = sum_bytes(matmuls)
    return registered(CODE).finding(
        message=message,
        fix_title=fix_title,
        receipts=receipts,
        effort="S" if hf else "M",
        risk="low",
        lever=lever,
        work=Work(
            now=(Part("per-expert matmuls", flops, moved, len(matmuls), dtype, tf32),),
            fixed=(
                Part(
                    "grouped matmuls", flops, moved, projections * KERNELS_PER_GROUPED_MM,
                    dtype, tf32,
                ),
            ),
            now_ops=tuple(op.index for op in matmuls),
        ),
        details={
            "levers": [LEVER] if hf else [],
            "modules": sorted(looped),
            "num_matmuls": len(matmuls),
            "num_forward_matmuls": len(forward),
            "num_projections": projections,
            "flops_share": flops / max(total_flops, 1),
            "num_host_syncs": len(syncs),
            "transformers": hf,
        },
    )
