"""COMP001 graph-breaks-and-recompiles: a compiled step whose code recompiles per call or breaks its graphs.

## What it does
Reads what ``torch.compile`` did from the step's first run to the capture (dynamo's own
records: the guard failures of every recompiled function, the graph breaks and the user line of
each, whether ``recompile_limit`` was hit). It reports each function that dynamo compiled more
than once, with the guards that failed (``L['self'].layer_idx == 0``, a KV cache layer's
``is_initialized``), and each graph break with its reason and line.

## Why is this bad?
A function that recompiles for every block (the blocks differ in an int attribute, or a Hugging
Face model's KV cache, kept on in training by its default config, is indexed by ``layer_idx``)
pays one compile per block, and after ``recompile_limit`` (8) calls dynamo gives up: the blocks
after it run uncompiled, so a 12-block model compiled per block gains nothing (issue 20: GPT-2,
1.00x). A graph break splits the program: the work on either side is not fused across it, the
break runs in Python, and under CUDA graphs each piece is replayed separately.

## Example
```python
model = GPT2LMHeadModel(GPT2Config())          # use_cache=True, as shipped
for block in model.transformer.h:
    block.compile()                            # recompiles per block, then runs uncompiled
```

Use instead:
```python
model.config.use_cache = False                 # a training step never reads the cache
for block in model.transformer.h:
    block.compile()                            # or: levers.apply(model, "compile-blocks")
```

## Fix
The `compile-blocks` and `compile-model` levers turn the cache off while training and trace int
module attributes unspecialised (`torch._dynamo.config.allow_unspec_int_on_nn_module`). A graph
break is fixed in the code on its line (no `.item()`, `print` or logging in a compiled forward;
`torch._dynamo.mark_dynamic` for a shape that changes every call).

## Fix safety
Exact: the KV cache is not read by a training step and an unspecialised int computes the same
values; the compiled code itself is compile-blocks' and compile-model's (changes numerics).

## Known problems
The cost is not priced: the time an uncompiled block or a broken graph loses is what the
lever's A/B measures (`levers ab WORKLOAD --lever compile-blocks`). Compiles of the captured step
itself are left out (the capture's dispatch mode can change dynamo's guards), so a step that
first runs under the capture (no warm-up) shows nothing. Blocks that differ in structure (a T5
stack's first block, a ResNet's stages) recompile once each, by nature; only the recompiles that
the fix can remove should be acted on.

## References
- https://docs.pytorch.org/docs/main/user_guide/torch_compiler/compile/programming_model.recompilation.html
- https://docs.pytorch.org/docs/stable/torch.compiler_troubleshooting.html (graph breaks)
- https://huggingface.co/docs/transformers/main/en/perf_train_gpu_one#gradient-checkpointing
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from levers.audit.config import RuleConfig
from levers.audit.finding import Finding, Receipt, Work
from levers.audit.rules.registry import registered, rule
from levers.capture.records import Capture
from levers.vocab import EXACT

CODE, NAME = "COMP001", "graph-breaks-and-recompiles"
# guard failures that the KV cache of a training step causes (transformers' cache_utils)
CACHE_MARKS = ("is_initialized", "past_key_value", "cache", ".layers[")
INT_MARKS = ("layer_idx", "_idx ==", "index ==")
# one recompile is how a first block that differs compiles (a T5 stack's relative-position bias,
# an input that does not require grad yet); one per block is two or more
MIN_RECOMPILES = 2


def _telling(reasons: list[str], marks: tuple[str, ...]) -> str:
    """The first guard failure that shows the cause (else the first one)."""
    # a guard line ends with "# <source> # <file:line> ...": the guard alone reads the same anywhere
    # and starts with dynamo's compile id ("2/1: "), which depends on what the process compiled
    lines = [
        re.sub(r"^\d+/\d+: ", "", line.split("  #")[0].strip())
        for r in reasons
        for line in r.splitlines()
        if line.strip()
    ]
    return next((line for line in lines if any(m in line for m in marks)), lines[0] if lines else "?")


SHAPE_MARKS = ("size(", ".size()", "shape")


def _fix_for(reasons: list[str]) -> tuple[str, str | None, str]:
    """The fix title, the lever and the telling guard failure for a function's recompiles."""
    text = " ".join(reasons)
    if any(mark in text for mark in CACHE_MARKS):
        return (
            "Turn the KV cache off while training (model.config.use_cache = False); "
            "compile-blocks and compile-model do",
            "compile-blocks",
            _telling(reasons, CACHE_MARKS),
        )
    if any(mark in text for mark in INT_MARKS):
        return (
            "Trace int module attributes unspecialised "
            "(torch._dynamo.config.allow_unspec_int_on_nn_module = True); compile-blocks does",
            "compile-blocks",
            _telling(reasons, INT_MARKS),
        )
    if any(mark in text for mark in SHAPE_MARKS):
        return (
            "Keep input shapes fixed (pad to a bucket) or mark the varying dimension dynamic "
            "(torch._dynamo.mark_dynamic)",
            None,
            _telling(reasons, SHAPE_MARKS),
        )
    return (
        "Make the guarded value the same on every call (TORCH_LOGS=recompiles lists each)",
        None,
        _telling(reasons, ()),
    )


def _receipt(entry: dict[str, Any], op: str) -> Receipt:
    return Receipt(
        file=entry["file"], line=int(entry["line"]), code=entry.get("code", ""), module=None,
        op=f"{op} {entry['count']}x",  # compiles, not calls per step
    )


def _recompile_finding(entry: dict[str, Any], limit_hit: bool) -> Finding:
    reasons = list(entry.get("reasons") or [])
    fix_title, lever, first = _fix_for(reasons)
    count = int(entry["count"])
    limit = (
        " and dynamo hit recompile_limit: the calls after it run uncompiled" if limit_hit else ""
    )
    return registered(CODE).finding(
        message=(
            f"{entry['function']} ({os.path.basename(entry['file'])}:{entry['line']}) recompiled "
            f"{count}x before the captured step{limit}; a failed guard: {first}"
        ),
        fix_title=fix_title,
        receipts=(_receipt(entry, "torch.compile recompile"),),
        effort="S",
        risk="low",
        severity="high" if limit_hit else "medium",
        lever=lever,
        work=Work(),
        details={"kind": "recompile", "count": count, "reasons": reasons,
                 "recompile_limit_hit": limit_hit},
    )


def _break_finding(entry: dict[str, Any]) -> Finding:
    count = int(entry["count"])
    return registered(CODE).finding(
        message=(
            f"the compiled graph breaks here {count}x per compile ({entry['reason']}): the code "
            "on either side is compiled apart and the break runs in Python"
        ),
        fix_title="Remove the break from the compiled code (no .item(), print or logging in a "
        "compiled forward), or compile the blocks only (compile-blocks)",
        receipts=(_receipt(entry, "torch.compile graph break"),),
        effort="M",
        risk="low",
        lever="compile-blocks",
        work=Work(),
        details={"kind": "graph-break", "count": count, "reason": entry["reason"]},
    )


@rule(CODE, NAME, severity="medium", fix_safety=EXACT, levers=("compile-blocks", "compile-model"))
def check(capture: Capture, config: RuleConfig) -> Iterator[Finding]:
    stats = capture.settings.get("compile")
    # torch.compile compiled nothing before the captured step
    if not stats:
        return
    limit_hit = bool(stats.get("recompile_limit_hit"))
    for entry in stats.get("recompiles") or []:
        # one recompile is not one per block
        if int(entry["count"]) < MIN_RECOMPILES and not limit_hit:
            continue
        yield _recompile_finding(entry, limit_hit)
    for entry in stats.get("graph_breaks") or []:
        # a break inside torch or transformers' logging is reported at the user's line only
        # when dynamo gave one
        if entry.get("line"):
            yield _break_finding(entry)
