"""DIST002 find-unused-parameters: DDP searches for unused parameters that the step does not have.

## What it does
On a DDP-wrapped model built with ``find_unused_parameters=True`` (and no ``static_graph``),
reads DDP's own statistics of the captured step and reports when no parameter went unused:
the search ran and found nothing. It names the extra all-reduce of the used-parameter map.

## Why is this bad?
With the flag, DDP walks the autograd graph from the forward's outputs every step to find the
parameters that will get no gradient, marks each parameter's use in a map and all-reduces that
map (one more collective per step, and a host-side pass over the graph). A model whose every
parameter gets a gradient pays this for nothing; it also delays the first bucket's all-reduce.

## Example
```python
model = DistributedDataParallel(model, find_unused_parameters=True)
```

Use instead:
```python
model = DistributedDataParallel(model)  # or static_graph=True when the unused set never changes
```

## Fix
Drop ``find_unused_parameters=True`` (no lever yet; a one-argument change). If some steps do
leave parameters unused (a branch not taken), ``static_graph=True`` keeps correctness when
the set is the same every step.

## Fix safety
Exact when every parameter gets a gradient every step; if a later step leaves one unused, DDP
raises an error that names it rather than computing anything different.

## Known problems
One captured step is checked: a model that leaves parameters unused only on some steps (a
conditional branch) looks like one that never does. DDP's statistics come from a private
method (``_get_ddp_logging_data``); without it the rule stays silent.

## References
- https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html (find_unused_parameters, static_graph)
"""

from __future__ import annotations

from collections.abc import Iterator

from levers.audit.config import RuleConfig
from levers.audit.finding import Finding
from levers.audit.patterns import fmt_bytes
from levers.vocab import EXACT
from levers.audit.rules.registry import registered, rule
from levers.audit.scale import ddp_settings, model_call_receipt
from levers.capture.collectives import collective_name, collectives, is_bucket
from levers.capture.records import Capture

CODE, NAME = "DIST002", "find-unused-parameters"


@rule(CODE, NAME, severity="low", fix_safety=EXACT)
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    ddp = ddp_settings(capture)
    # not a DDP-wrapped model, or the flag is off
    if ddp is None or not ddp.get("find_unused_parameters"):
        return
    # static_graph decides the unused set once, not every step
    if ddp.get("static_graph"):
        return
    logging = ddp.get("logging") or {}
    # without DDP's statistics there is no telling whether a parameter went unused
    if "unused_parameter_size" not in logging:
        return
    # some parameters did go unused: the flag is needed
    if int(logging["unused_parameter_size"]) > 0:
        return
    maps = [
        op
        for op in collectives(capture)
        if collective_name(op) == "allreduce" and op.phase == "backward" and not is_bucket(op)
    ]
    num_params = int(logging.get("num_parameter_tensors") or 0)
    map_text = (
        f" and all-reduces a {maps[0].inputs[0].numel}-entry used-parameter map"
        if maps and maps[0].inputs
        else ""
    )
    yield registered(CODE).finding(
        message=(
            f"find_unused_parameters=True, but every one of the {num_params} parameter tensors "
            f"({fmt_bytes(int(logging.get('total_parameter_size_bytes') or 0))}) got a gradient in "
            f"the captured step: DDP walks the autograd graph every step{map_text} to find none."
        ),
        fix_title="Drop find_unused_parameters=True (or use static_graph=True)",
        receipts=(
            model_call_receipt(
                capture,
                op="DDP(find_unused_parameters=True)",
                shapes=f"{num_params} parameter tensors",
            ),
        ),
        severity="low",
        effort="S",
        risk="low",
        lever=None,
        details={
            "num_parameter_tensors": num_params,
            "unused_parameter_size": 0,
            "num_used_map_allreduces": len(maps),
        },
    )
