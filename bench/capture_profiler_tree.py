"""Can a step's op records come from the profiler's event tree instead of a dispatch mode?

Issue 23's design records the captured step with the profiler alone. This script measures how
far the profiler's own record of a step is from the op list the capture's ``TorchDispatchMode``
records today, on any workload and on the CPU:

1. capture the step as levers does in one pass (``mode="one-pass"``), keeping its op names;
2. run one more step under ``torch.profiler`` (CPU activity, shapes and memory; no dispatch
   mode, no function mode) and walk the C++ event tree
   (``kineto_results.experimental_event_tree()``, not ``prof.events()``);
3. derive the ops a dispatch mode would see: an aten event whose op has a
   ``CompositeImplicitAutograd`` kernel decomposes above the Python key, so its children are
   walked; any other aten event is one op, and what it calls runs below the mode;
4. align the two name sequences and count what matches in order, what only the capture has and
   what only the profiler has;
5. for the forward ops matched in order, count those whose input metas, module (the innermost
   ``nn.Module`` frame of the recorded Python stack) and user function (file and function name:
   the tracer records calls, not the line that ran the op) read from the tree equal the
   capture's.

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
from levers.capture.timed import decomposes
from levers.environment import environment
from levers.loader import load_workload, parse_set
from levers.output.atomic import atomic_write_text


def mode_ops(roots: list[Any]) -> list[Any]:
    """The aten events of the event tree that a dispatch mode would see, in order."""
    found: list[Any] = []
    torch_op = torch._C._profiler._EventType.TorchOp

    def walk(event: Any) -> None:
        name = event.name
        if event.tag == torch_op and name.startswith("aten::"):
            if not decomposes(name):
                found.append(event)
                return  # what it calls runs below the mode
        for child in event.children:
            walk(child)

    for root in sorted(roots, key=lambda e: e.start_time_ns):
        walk(root)
    return found


def input_metas(event: Any) -> list[tuple]:
    """(shape, dtype, device) of the op's tensor inputs, lists flattened, as the capture
    records them."""
    found = []
    for value in event.extra_fields.inputs:
        for item in value if isinstance(value, list) else [value]:
            if type(item).__name__ == "_TensorMetadata":
                found.append((tuple(item.sizes), str(item.dtype).removeprefix("torch."),
                              str(item.device)))
    return found


def module_and_source(event: Any, paths: dict[int, str]) -> tuple[str | None, tuple | None]:
    """The innermost model module (by its ``nn.Module`` frame) and user function (file name,
    function name) above the event on the Python stack the profiler recorded. The tracer
    records calls, named by the function's first line: the line that ran the op is not there."""
    py_call = torch._C._profiler._EventType.PyCall
    module = source = None
    parent = event.parent
    while parent is not None and (module is None or source is None):
        if parent.tag == py_call:
            info = parent.extra_fields.module
            if info is not None and module is None:
                module = paths.get(info.self_ptr)
            elif info is None and source is None:
                frame = parent.name  # "path/to/file.py(FIRST LINE): function"
                file, _, rest = frame.partition("(")
                if file.endswith(".py") and not _in_torch_or_levers_machinery(file):
                    source = (os.path.basename(file), rest.partition(": ")[2])
        parent = parent.parent
    return module, source


def _in_torch_or_levers_machinery(file: str) -> bool:
    return file.startswith("torch/") or "/torch/" in file or (
        "levers/" in file and "levers/workloads/" not in file)


def compare(spec: str, sets: list[str]) -> dict[str, Any]:
    workload = load_workload(spec, parse_set(sets))
    for _ in range(2):
        workload.step()
    ops = capture_step(workload, warmup=0, timed=0, ran_before=True, mode="one-pass").ops
    captured = [".".join(op.name.split(".")[:2]) for op in ops]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                 profile_memory=True, with_stack=True) as prof:
        workload.step()
    t0 = time.perf_counter()
    roots = prof.profiler.kineto_results.experimental_event_tree()
    tree_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    events = mode_ops(roots)
    walk_s = time.perf_counter() - t0
    derived = ["aten." + e.name.removeprefix("aten::") for e in events]
    matcher = difflib.SequenceMatcher(a=captured, b=derived, autojunk=False)
    matched = sum(block.size for block in matcher.get_matching_blocks())
    # the fields of the forward ops matched in order: do the tree's agree with the capture's?
    paths = {id(m): name for name, m in workload.model.named_modules()}
    agree: Counter[str] = Counter()
    num_forward = 0
    for block in matcher.get_matching_blocks():
        for k in range(block.size):
            op, event = ops[block.a + k], events[block.b + k]
            if op.phase != "forward":
                continue
            num_forward += 1
            mine = [(m.shape, m.dtype, m.device) for m in op.inputs]
            agree["inputs"] += mine == input_metas(event)
            module, source = module_and_source(event, paths)
            agree["module"] += module == op.module
            agree["source_function"] += source == (
                None if op.source is None
                else (os.path.basename(op.source.file), op.source.function))
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
        # of the forward ops matched in order, how many have the capture's input metas, module
        # and source function in the tree
        "num_forward_matched": num_forward,
        "forward_fields_agree": dict(agree),
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
              f"forward fields agreeing of {row['num_forward_matched']}: "
              f"{row['forward_fields_agree']}; "
              f"only captured {row['only_captured'][:5]}; only profiled {row['only_profiled'][:5]}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
