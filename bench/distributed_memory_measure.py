"""One rank's measured peak of the ``hf`` llama under DDP or FSDP2 (run by torchrun).

    torchrun --nproc_per_node=2 bench/distributed_memory_measure.py --strategy ddp --size 1b \
        --steps 3 --out OUT/measured_ddp

Each rank builds ``bench/distributed_workloads.py:hf_parallel``, runs ``--steps`` steps and
writes ``OUT/rank<R>.json`` with ``torch.cuda.max_memory_allocated`` and
``max_memory_reserved`` over the build and the steps (on a CPU: nulls, there is no allocator).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))


def main() -> int:
    import torch
    import torch.distributed as dist

    from distributed_workloads import hf_parallel

    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", choices=("ddp", "fsdp2"), required=True)
    parser.add_argument("--size", default="1b")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    workload = hf_parallel(strategy=args.strategy, size=args.size, device=args.device)
    for _ in range(args.steps):
        workload.step()
    on_cuda = workload.device.type == "cuda"
    if on_cuda:
        torch.cuda.synchronize()  # sync point: the peaks are read after the last step
    row = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "strategy": args.strategy,
        "size": args.size,
        "steps": args.steps,
        "params": workload.params,
        "device_name": torch.cuda.get_device_name() if on_cuda else "cpu",
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if on_cuda else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if on_cuda else None,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{row['rank']}.json").write_text(json.dumps(row, indent=1) + "\n")
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
