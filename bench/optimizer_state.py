"""fp32 AdamW against the optimizer-state levers: loss curves, step time and state bytes.

On the built-in ``llama`` (default ``size=1b``: about 0.95e9 parameters, batch 4 x 2048 tokens,
bf16 autocast, fp32 master weights) it trains, from the same initial weights and the same batches
(the workload's seed), one run per variant for ``--steps`` (500) steps:

- ``fp32-fused``: the workload as built, ``torch.optim.AdamW(fused=True)`` with fp32 moments;
- ``adamw-bf16-state``, ``adamw-8bit``: the same workload with the lever applied before the
  first step.

Per run it records:

- the train loss of every step, and the held-out loss (``Workload.eval_losses``: 32 fixed
  sequences, the quality read of ``levers ab``) every ``--eval-every`` steps and after the last;
- the step time of every step after ``--warmup`` (10; the levers compile torchao's update per
  parameter shape on their first step): median, IQR, min and max;
- the optimizer state: summed over its tensors (torchao's 8-bit state by its codes, scales and
  map), moments alone and all of it; and the device memory it took, ``memory_allocated`` after
  the first step (gradients freed, ``zero_grad(set_to_none=True)``) less before it: the state
  plus what the first step keeps (cuBLAS workspaces, the same on every run);
- the peak allocated over the timed steps.

And per lever, paired with ``fp32-fused``: the held-out loss at each eval point as ``levers ab``
reads it (mean per-example difference, lever - fp32, with the paired bootstrap CI95 of
:func:`levers.ab.stats.paired_difference_ci`, and its verdict), the train-loss difference over
the last 50 steps (paired by step), and ``levers memory``'s prediction of the state the lever
frees (its what-if's ``delta_state_bytes``: ``bf16-optimizer-states`` or ``8bit-optimizer-states``,
predicted for the ``--gpu-spec`` GPU on fake tensors) beside the measured change.

Every row carries the commit, torch and torchao versions, the GPU's name and the shape. The
results are written to ``OUT/optimizer_state.json`` atomically after each run (a run killed
midway keeps the rows before it).

Usage, from the repository root:

    python bench/optimizer_state.py --out bench/results/optimizer_state_h200        # the H200 run
    python bench/optimizer_state.py --quick --out /tmp/optimizer_state_quick         # CPU smoke
    python bench/optimizer_state.py --device cpu --size tiny --out ...                # CPU read
    python bench/optimizer_state.py --levers adamw-8bit --out ...                     # one lever

A run of the three variants at 1b is about 3 x (500 steps + torchao's first-step compile of a
few minutes for each lever) plus levers memory's prediction (~20 s); ``--levers`` splits it
into shorter runs (each with its own fp32 baseline, the same one: same seed, same batches).

``--quick`` runs the tiny llama on the CPU for 3 steps (an eval after each) with torchao's
update run eagerly (its compile takes minutes on a 2-core CPU); tests/bench run it.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import json
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

BASELINE = "fp32-fused"
LEVERS = ("adamw-bf16-state", "adamw-8bit")
TRAIN_TAIL = 50  # the train-loss read pairs the last this many steps
NUM_RESAMPLES = 10_000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for optimizer_state.json")
    parser.add_argument("--steps", type=int, default=500, help="training steps per run (500)")
    parser.add_argument("--eval-every", type=int, default=50, help="held-out loss every N steps")
    parser.add_argument("--warmup", type=int, default=10, help="steps left out of the timing")
    parser.add_argument("--size", default="1b", help="llama size (tiny, 1b, 8b)")
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--seq-len", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--levers", default=",".join(LEVERS), help="levers to run (both)")
    parser.add_argument("--gpu-spec", default="h200", help="the GPU levers memory predicts for")
    parser.add_argument("--quick", action="store_true", help="CPU smoke: tiny, 3 steps, eager")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: a quality read without a GPU (torchao's update eager)")
    args = parser.parse_args(argv)
    if args.quick:
        args.size, args.steps, args.eval_every, args.warmup = "tiny", 3, 1, 1
        args.device = "cpu"
    if args.steps < 2 or args.eval_every < 1 or not 0 <= args.warmup < args.steps:
        parser.error("need --steps >= 2, --eval-every >= 1 and 0 <= --warmup < --steps")
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timing and memory boundary


def allocated(device: torch.device) -> int | None:
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else None


def release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def step_time(step_s: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1e3 for s in step_s)
    return {
        "ms_per_step_median": statistics.median(ms),
        "ms_per_step_iqr": [ms[len(ms) // 4], ms[(3 * len(ms)) // 4]],
        "ms_per_step_min_max": [ms[0], ms[-1]],
        "num_timed_steps": len(ms),
    }


def run(variant: str, params: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Train one variant; returns its row (without the provenance fields)."""
    import levers
    from levers.levers._optimizer_state import state_nbytes
    from levers.loader import load_workload

    workload = load_workload("llama", params)
    device = workload.device
    optimizer = workload.optimizer
    if variant != BASELINE:
        levers.apply(workload, variant)
    sync(device)
    before_state = allocated(device)
    train_losses: list[torch.Tensor] = []
    held_out: dict[int, list[float]] = {}
    step_s: list[float] = []
    state: dict[str, Any] = {}
    for step in range(1, args.steps + 1):
        if step == args.warmup + 1 and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = time.perf_counter()
        train_losses.append(workload.step())
        sync(device)
        if step > args.warmup:
            step_s.append(time.perf_counter() - t0)
        if step == 1:
            after = allocated(device)
            state = {
                "state_bytes": state_nbytes(optimizer),
                "state_moment_bytes": state_nbytes(optimizer, moments_only=True),
                "state_device_bytes": None if after is None else after - before_state,
            }
        if step % args.eval_every == 0 or step == args.steps:
            held_out[step] = workload.eval_losses().double().cpu().tolist()  # sync point
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    row = {
        "variant": variant,
        "optimizer": type(optimizer).__name__,
        "inner": type(getattr(optimizer.step, "inner", optimizer)).__name__,
        "num_steps": args.steps,
        "train_loss": [float(x) for x in torch.stack(train_losses).float().cpu()],  # sync point
        "held_out_loss": {str(k): v for k, v in held_out.items()},
        "held_out_loss_mean": {str(k): statistics.fmean(v) for k, v in held_out.items()},
        **state,
        **step_time(step_s),
        "peak_allocated_bytes": peak,
    }
    del workload, optimizer
    release(device)
    return row


def predicted_state_deltas(params: dict[str, Any], gpu: str) -> dict[str, Any]:
    """levers memory's optimizer-state what-ifs (fake tensors on the CPU, for ``gpu``)."""
    from levers.hardware import resolve_gpu
    from levers.memory.prediction import run_prediction, source_of
    from levers.memory.whatif import bf16_optimizer_states, float32_moments, int8_optimizer_states

    base = run_prediction(source_of("llama", params), resolve_gpu(gpu), num_steps=2)
    out: dict[str, Any] = {
        "fp32_moment_bytes": sum(a.nbytes for _, a in float32_moments(base.trace)),
        "peak_allocated_bytes": base.replay.peak_allocated_bytes,
    }
    for whatif in (bf16_optimizer_states(base), int8_optimizer_states(base)):
        out[whatif.lever] = None if not whatif.applicable else {
            "whatif": whatif.name,
            "delta_state_bytes": whatif.delta_state_bytes,
            "delta_allocated_bytes": whatif.delta_allocated_bytes,
            "method": whatif.method,
        }
    return out


def paired(baseline: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The lever against fp32, paired: held-out loss per example at each eval point, as
    levers ab reads it, and the train loss by step over the last steps."""
    from levers.ab.stats import paired_difference_ci
    from levers.ab.verdict import difference_verdict

    reads = {}
    for step, base in baseline["held_out_loss"].items():
        ci = paired_difference_ci(
            base, row["held_out_loss"][step], num_resamples=NUM_RESAMPLES, seed=0
        )
        reads[step] = {
            "difference": ci.difference,
            "ci95": [ci.lo, ci.hi],
            "verdict": difference_verdict(ci.lo, ci.hi, "lower"),
        }
    tail = min(TRAIN_TAIL, len(row["train_loss"]))
    train = paired_difference_ci(
        baseline["train_loss"][-tail:], row["train_loss"][-tail:],
        num_resamples=NUM_RESAMPLES, seed=0,
    )
    last = str(max(int(k) for k in reads))
    return {
        "held_out_loss_vs_fp32": reads,
        "held_out_loss_vs_fp32_final": reads[last],
        "train_loss_vs_fp32_last_steps": {
            "num_steps": tail, "difference": train.difference, "ci95": [train.lo, train.hi],
        },
        "state_moment_bytes_vs_fp32": row["state_moment_bytes"] - baseline["state_moment_bytes"],
        "state_device_bytes_vs_fp32": (
            None if row["state_device_bytes"] is None
            else row["state_device_bytes"] - baseline["state_device_bytes"]
        ),
        "step_ms_ratio_vs_fp32": row["ms_per_step_median"] / baseline["ms_per_step_median"],
    }


def write_json(path: Path, data: Any) -> None:
    from levers.output.atomic import atomic_write_text

    atomic_write_text(path, json.dumps(data, indent=1, default=str) + "\n", make_parents=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from levers.environment import levers_commit_id

    levers_to_run = [name.strip() for name in args.levers.split(",") if name.strip()]
    unknown = sorted(set(levers_to_run) - set(LEVERS))
    if unknown:
        raise SystemExit(f"unknown lever(s) {', '.join(unknown)}; these are {', '.join(LEVERS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU (or --device cpu, or --quick for the CPU smoke run)")
    if args.device == "cpu":
        # torchao compiles its update per parameter shape at its first step: minutes on a CPU
        torch.compile = lambda fn, **kwargs: fn  # type: ignore[assignment]
    device = args.device
    params: dict[str, Any] = {"size": args.size, "device": device, "seed": args.seed}
    if args.batch_size is not None:
        params["batch_size"] = args.batch_size
    if args.seq_len is not None:
        params["seq_len"] = args.seq_len
    gpu = "cpu" if device == "cpu" else torch.cuda.get_device_name()
    try:
        torchao = importlib.metadata.version("torchao")
    except importlib.metadata.PackageNotFoundError:
        torchao = None
    provenance = {
        "commit": levers_commit_id(),
        "torch": torch.__version__,
        "torchao": torchao,
        "gpu": gpu,
        "shape": " ".join(f"{k}={v}" for k, v in params.items() if k != "device"),
    }
    out = Path(args.out) / "optimizer_state.json"
    result: dict[str, Any] = {
        "meta": {
            **provenance,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python bench/optimizer_state.py " + shlex.join(argv or sys.argv[1:]),
            "workload": "llama",
            "params": params,
            "steps": args.steps,
            "eval_every": args.eval_every,
            "warmup": args.warmup,
            "quick": args.quick,
        },
        "rows": [],
        "paired": {},
    }
    predicted = predicted_state_deltas({k: v for k, v in params.items() if k != "device"},
                                       args.gpu_spec)
    result["predicted"] = {"gpu_spec": args.gpu_spec, **predicted}
    write_json(out, result)
    rows: dict[str, dict[str, Any]] = {}
    for variant in (BASELINE, *levers_to_run):
        try:
            row = run(variant, params, args)
        except Exception as exc:  # noqa: BLE001 - an honest failed row, the others still run
            release(torch.device(device))
            row = {"variant": variant, "error": f"{type(exc).__name__}: {exc}"[:500]}
        row = {**row, **provenance}
        rows[variant] = row
        result["rows"].append(row)
        if variant != BASELINE and "error" not in row and "error" not in rows[BASELINE]:
            pair = paired(rows[BASELINE], row)
            pair["predicted_delta_state_bytes"] = (predicted.get(variant) or {}).get(
                "delta_state_bytes"
            )
            result["paired"][variant] = {**pair, **provenance}
        write_json(out, result)
        if "error" in row:
            print(f"{variant:18s} failed: {row['error']}", flush=True)
        else:
            print(
                f"{variant:18s} {row['ms_per_step_median']:8.1f} ms/step  state "
                f"{row['state_moment_bytes'] / 2**20:9.1f} MiB  held-out "
                f"{row['held_out_loss_mean'][str(args.steps)]:.4f}",
                flush=True,
            )
    print(f"wrote {out}", flush=True)
    return 0 if all("error" not in row for row in rows.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
