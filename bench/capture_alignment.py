"""Where the two passes of a capture differ: the ops each pass saw that the other did not.

A two-pass capture joins the timed pass (the profiler alone) to the content pass (the op
recorder) by aligning their op streams (:mod:`levers.capture.align`); the share of the content
ops that align is the capture's ``coverage``. This script captures each case in two passes and
writes, per case, the coverage and the unaligned ops of each side counted by name (with one
example of their input shapes), so a stream difference the alignment does not know can be seen.

    PYTHONPATH=src python bench/capture_alignment.py --out OUT_DIR            # GPU: the cases below
    PYTHONPATH=src python bench/capture_alignment.py --out OUT_DIR --smoke    # CPU, tiny shapes

Cases: the capture tests' fixture net, and the GPT-2 and ViT shapes of bench/capture_overhead.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "src"), os.path.join(ROOT, "bench"), os.path.join(ROOT, "tests")]

import capture_overhead  # noqa: E402
from capture import fixture_models  # noqa: E402
from levers.capture import capture_step  # noqa: E402
from levers.capture import step as capture_step_module  # noqa: E402
from levers.capture.align import align  # noqa: E402


def unaligned(case: str, workload: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    join = capture_step_module.join_passes

    def recording_join(content, timed):
        content_stream = [(op.name, tuple(m.shape for m in op.inputs)) for op in content.ops]
        timed_stream = [(e.name, e.input_shapes) for e in timed.ops.ops]
        alignment = align(content_stream, timed_stream)
        aligned_content = {i for i in alignment.content_of_timed if i is not None}
        seen["content"] = [s for i, s in enumerate(content_stream) if i not in aligned_content]
        seen["timed"] = [
            s for s, i in zip(timed_stream, alignment.content_of_timed) if i is None
        ]
        seen["num_content"], seen["num_timed"] = len(content_stream), len(timed_stream)
        return join(content, timed)

    capture_step_module.join_passes = recording_join
    try:
        capture = capture_step(workload, warmup=1, timed=1, mode="two-pass")
    finally:
        capture_step_module.join_passes = join

    def by_name(stream: list[tuple[str, Any]]) -> list[dict[str, Any]]:
        counts = collections.Counter(name for name, _ in stream)
        example = {}
        for name, shapes in stream:
            example.setdefault(name, [list(s) for s in shapes])
        return [{"op": n, "count": c, "example_shapes": example[n]} for n, c in counts.most_common()]

    row = {
        "case": case,
        "coverage": capture.passes.coverage,
        "mode": capture.passes.mode,
        "num_content_ops": seen["num_content"],
        "num_timed_ops": seen["num_timed"],
        "unaligned_content": by_name(seen["content"]),
        "unaligned_timed": by_name(seen["timed"]),
        "torch": torch.__version__,
    }
    print(f"{case}: coverage {row['coverage']:.3f} ({row['mode']}), "
          f"{len(seen['content'])} content ops and {len(seen['timed'])} timed ops unaligned")
    for side in ("unaligned_content", "unaligned_timed"):
        print(f"  {side}: " + ", ".join(f"{r['op']} x{r['count']}" for r in row[side][:12]))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shapes")
    args = parser.parse_args(argv)
    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    os.makedirs(args.out, exist_ok=True)
    cases = {
        "fixture-net": lambda: fixture_models.net(device=str(device)),
        "gpt2-medium8": lambda: capture_overhead.gpt2_medium8(device, args.smoke)[0],
        "vit-b16": lambda: capture_overhead.vit_b16(device, args.smoke)[0],
    }
    rows = [unaligned(name, build()) for name, build in cases.items()]
    path = os.path.join(args.out, "capture_alignment.json")
    with open(path + ".tmp", "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(path + ".tmp", path)
    print("wrote", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
