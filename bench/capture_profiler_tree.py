"""Can a step's op records come from the profiler's event tree instead of a dispatch mode?

Issue 23's design records the captured step with the profiler alone. This script measures how
far the profiler's own record of a step is from the op list the capture's ``TorchDispatchMode``
records today, on any workload and on the CPU:

1. capture the step as levers does (``capture_step``), keeping its op names;
2. run one more step under ``torch.profiler`` (CPU activity, shapes and memory; no dispatch
   mode, no function mode) and walk the C++ event tree
   (``kineto_results.experimental_event_tree()``, not ``prof.events()``);
3. derive the ops a dispatch mode would see: an aten event whose op has a
   ``CompositeImplicitAutograd`` kernel decomposes above the Python key, so its children are
   walked; any other aten event is one op, and what it calls runs below the mode;
4. align the two name sequences and count what matches in order, what only the capture has and
   what only the profiler has.

One JSON row per workload to ``OUT_DIR/capture_profiler_tree.jsonl``: commit, torch version, op
counts, matches, the commonest differences and the time to read and walk the tree.

Usage:
    python bench/capture_profiler_tree.py --out OUT_DIR --case llama --case demo
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import sys
import time
from collections import Counter
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from levers.capture import capture_step
from levers.environment import environment
from levers.loader import load_workload, parse_set
from levers.output.atomic import atomic_write_text

_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_decomposes: dict[str, bool] = {}


def decomposes(name: str) -> bool:
    """Whether aten op ``name`` ("aten::linear") runs as other ops above the Python key."""
    known = _decomposes.get(name)
    if known is None:
        # the profiler names the op without its overload: the default one where there is one,
        # else any overload but the out= variants (an approximation)
        packet = getattr(torch.ops.aten, name.removeprefix("aten::"), None)
        overloads = packet.overloads() if packet is not None else []
        if "default" in overloads:
            names = [name]
        else:
            names = [f"{name}.{o}" for o in overloads if not o.startswith("out")]
        try:
            known = any(_has_kernel(n, "CompositeImplicitAutograd") for n in names)
        except RuntimeError:  # not an operator the dispatcher knows
            known = False
        _decomposes[name] = known
    return known


def mode_ops(roots: list[Any]) -> list[str]:
    """The aten ops of the event tree that a dispatch mode would see, in order, as
    ``aten.<name>`` (the capture's names without the overload)."""
    found: list[str] = []
    torch_op = torch._C._profiler._EventType.TorchOp

    def walk(event: Any) -> None:
        name = event.name
        if event.tag == torch_op and name.startswith("aten::"):
            if not decomposes(name):
                found.append("aten." + name.removeprefix("aten::"))
                return  # what it calls runs below the mode
        for child in event.children:
            walk(child)

    for root in sorted(roots, key=lambda e: e.start_time_ns):
        walk(root)
    return found


def compare(spec: str, sets: list[str]) -> dict[str, Any]:
    workload = load_workload(spec, parse_set(sets))
    for _ in range(2):
        workload.step()
    captured = [".".join(op.name.split(".")[:2]) for op in capture_step(
        workload, warmup=0, timed=0, ran_before=True).ops]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 profile_memory=True) as prof:
        workload.step()
    t0 = time.perf_counter()
    roots = prof.profiler.kineto_results.experimental_event_tree()
    tree_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    derived = mode_ops(roots)
    walk_s = time.perf_counter() - t0
    matcher = difflib.SequenceMatcher(a=captured, b=derived, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    only_captured: Counter[str] = Counter()
    only_profiled: Counter[str] = Counter()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            only_captured.update(captured[i1:i2])
        if tag in ("insert", "replace"):
            only_profiled.update(derived[j1:j2])
    env = environment(workload.device)
    return {
        "bench": "capture_profiler_tree",
        "case": " ".join([spec, *sets]),
        "num_captured_ops": len(captured),
        "num_derived_ops": len(derived),
        "num_matched_in_order": matched,
        "matched_fraction": matched / max(len(captured), 1),
        "only_captured": only_captured.most_common(10),
        "only_profiled": only_profiled.most_common(10),
        "tree_s": tree_s,
        "walk_s": walk_s,
        "commit": env["levers_commit"],
        "torch": env["torch"],
        "device": env["device"],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for capture_profiler_tree.jsonl")
    parser.add_argument("--case", action="append", required=True,
                        help='a workload spec and --set items, e.g. "llama size=tiny"')
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "capture_profiler_tree.jsonl")
    for case in args.case:
        spec, *sets = case.split()
        row = compare(spec, sets)
        existing = open(path).read() if os.path.exists(path) else ""
        atomic_write_text(path, existing + json.dumps(row) + "\n")
        print(f"{case}: {row['num_captured_ops']} captured ops, {row['num_derived_ops']} derived, "
              f"{row['num_matched_in_order']} in order ({row['matched_fraction']:.1%}); "
              f"only captured {row['only_captured'][:5]}; only profiled {row['only_profiled'][:5]}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
