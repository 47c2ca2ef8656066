"""OPT001 unfused-optimizer: Adam, AdamW or SGD running per-parameter or foreach kernels on a GPU.

## What it does
On a GPU capture, reads the optimizer's class and settings and the ops of the optimizer phase.
When the optimizer is Adam, AdamW or SGD and its step ran as a per-parameter loop or as foreach
kernels rather than PyTorch's fused implementation, it reports the mode, the kernels launched
and the bytes moved per step.

## Why is this bad?
A foreach step launches one multi-tensor kernel per elementwise operation of the update (about
ten for AdamW), each reading and writing the parameters or their states; a per-parameter loop
launches that many per parameter. The fused implementation reads parameters, gradients and
states once and writes them once, in a handful of launches.

## Example
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
```

Use instead:
```python
optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=True)
```

## Fix
`fused=True` (lever `fused-optimizer`).

## Fix safety
Changes numerics at the level of floating-point reassociation within the update; the fused
step's state tensors live on the device, so a resumed checkpoint must load them there.

## Known problems
Only GPU captures are checked: on a CPU capture the built-in workloads pick the implementation
per device, so the CPU choice says nothing about the GPU run. Optimizers other than Adam, AdamW
and SGD are not checked.

## References
- https://pytorch.org/docs/stable/optim.html#algorithms (foreach and fused implementations)
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.finding import AlreadyRight, Finding, Part, Receipt, Work
from levers.audit.patterns import fmt_bytes, num_kernels, sum_bytes
from levers.audit.rules.registry import registered, rule
from levers.vocab import CHANGES_NUMERICS

CODE, NAME = "OPT001", "unfused-optimizer"
FUSABLE = ("Adam", "AdamW", "SGD")
# bytes per parameter element of a fused step, as multiples of the parameter bytes:
# Adam(W) reads param, grad, exp_avg, exp_avg_sq and writes param and both states
FUSED_PASSES = {"Adam": 7, "AdamW": 7, "SGD": 5}


def optimizer_mode(capture: Capture) -> str:
    """ "fused", "foreach" or "per-parameter", from the optimizer-phase ops."""
    names = [op.name for op in capture.ops if op.phase == "optimizer"]
    if any(n.startswith("aten._fused_") for n in names):
        return "fused"
    if any(n.startswith("aten._foreach_") for n in names):
        return "foreach"
    return "per-parameter"


def grad_bytes(capture: Capture) -> int:
    """Bytes of the gradients accumulated in backward (= parameter bytes for fp32 params)."""
    total = 0
    for op in capture.ops:
        if (
            op.phase == "backward"
            and (op.autograd_node or "").endswith("AccumulateGrad")
            and op.outputs
        ):
            meta = op.outputs[0]
            total += meta.numel * (2 if meta.dtype in ("bfloat16", "float16") else 4)
    return total


def already_right(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    """A fused optimizer on a GPU."""
    info = capture.settings.get("optimizer") or {}
    if not config.on_gpu or not info or optimizer_mode(capture) != "fused":
        return None
    return AlreadyRight(
        "OPT001", "fused optimizer", f"{info.get('class')} with fused=True"
    )


@rule(
    CODE, NAME, severity="medium", fix_safety=CHANGES_NUMERICS, levers=("fused-optimizer",),
    already_right=(already_right,),
)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    # the implementation is chosen per device; a CPU capture says nothing about the GPU run
    if not config.on_gpu:
        return
    info = capture.settings.get("optimizer") or {}
    cls = info.get("class")
    # no optimizer, or one without a fused implementation
    if cls not in FUSABLE:
        return
    mode = optimizer_mode(capture)
    # already fused
    if mode == "fused":
        return
    opt_ops = [op for op in capture.ops if op.phase == "optimizer"]
    # no optimizer step ran in the captured step
    if not opt_ops:
        return
    param_bytes = grad_bytes(capture)
    kernels = num_kernels(opt_ops)
    moved = sum_bytes(opt_ops)
    source = next((op.source for op in opt_ops if op.source is not None), None)
    num_params = int(info.get("num_params") or 0)
    yield registered(CODE).finding(
        message=(
            f"{cls} runs {mode} kernels: {kernels} kernels moving {fmt_bytes(moved)} per step "
            f"over {num_params} parameter tensors ({fmt_bytes(param_bytes)}); fused=True does "
            f"the update in one pass of about {fmt_bytes(FUSED_PASSES[cls] * param_bytes)}."
        ),
        fix_title=f"Construct {cls}(..., fused=True)",
        receipts=(
            Receipt(
                file=source.file if source else "<unknown>",
                line=source.line if source else 0,
                code=source.code if source else "",
                module=None,
                op=f"{cls}.step ({mode})",
                shapes=f"{num_params} parameter tensors",
            ),
        ),
        effort="S",
        risk="low",
        work=Work(
            fixed=(
                Part(
                    f"fused {cls}",
                    bytes=FUSED_PASSES[cls] * param_bytes,
                    num_kernels=max(1, num_params // 64),
                ),
            ),
            now_ops=tuple(op.index for op in opt_ops),
        ),
        details={"class": cls, "mode": mode, "kernels": kernels, "moved_bytes": moved},
    )
