"""Benchmark probe: why a stack (or a peer's form) pays what it pays on a model, beside the eager
step, in one process: first written for compile-model's CUDA-graph form (``backend=cudagraphs``).

For each model and variant (``eager``, then each ``--stacks`` entry: levers joined by ``+``,
``channels-last+compile-model:backend=cudagraphs``, or ``peer:`` and a peer's transforms as
``bench/levers_vs_peers.py``'s ``apply_peer`` takes them, ``peer:float8-torchtitan+compile-layers``,
the model's KV cache off as ``bench/tune_sweep.py`` runs its peers) it builds the workload fresh,
runs warm-up and timed steps (synchronised, per-step wall times), then reads what dynamo did
(graphs, graph breaks, recompiles, CUDA-graph skips and their reasons) and profiles one more step:
its host wall time, the GPU's kernel time, the number of kernel launches outside a graph
replay, and the kernels that took the most GPU time (``top_kernels``: name, count, ms); and the
caching allocator's retries over the timed steps (``alloc_retries``: each a device sync). A
launch-bound eager step shows wall >> kernel time; a replayed step that still launches thousands
of kernels was not captured; a float8 step whose matmuls are not float8 GEMMs shows it by name.

``--ab BASE>STACK`` (';'-separated, each side '+'-joined levers) runs levers tune's A/B of that
increment as tune runs it (``levers.tune.measure.ab_measure``: the parity gate, programs timed as
the parity steps compiled them), and once more compiled as the user runs them (``as_run``): the
trial's ratio, each side's step times, where its random numbers were drawn and the allocator's
retries over the whole trial. ``--stacks-after`` times stacks once more after the A/Bs, in the
same process: whether what an A/B leaves behind (its float64 reference that did not fit, say)
slows what runs after it.

    PYTHONPATH=src python bench/cudagraphs_probe.py --models arch@timm:inception_resnet_v2 \
        --out $OUT/cudagraphs_probe
    PYTHONPATH=/tmp/site:src python bench/cudagraphs_probe.py --models zoo@mistral \
        --stacks "compile-blocks;compile-blocks+float8;peer:float8-torchtitan+compile-layers" \
        --ab "compile-blocks>compile-blocks+float8" --out $OUT/float8_probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import levers  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.levers._find import training_cache_off  # noqa: E402
from levers_vs_peers import _sync, apply_peer  # noqa: E402
from tune_sweep import _environment, _free, model_params  # noqa: E402

PEER = "peer:"
TOP_KERNELS = 25


def _counters() -> dict:
    from torch._dynamo.utils import counters

    return {group: dict(values) for group, values in counters.items()
            if group in ("stats", "graph_break", "inductor", "frames", "recompiles")}


def _alloc_retries() -> int | None:
    """The caching allocator's retries so far (a cudaMalloc that failed, the cache freed, and
    tried again: each a device sync); None off CUDA."""
    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.memory_stats().get("num_alloc_retries", 0))


def _memory() -> dict | None:
    """What the process holds on the device now (GiB): allocated, reserved by the caching
    allocator, and what the driver reports free; None off CUDA."""
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return {"allocated_gib": round(torch.cuda.memory_allocated() / 2**30, 2),
            "reserved_gib": round(torch.cuda.memory_reserved() / 2**30, 2),
            "free_gib": round(free / 2**30, 2), "total_gib": round(total / 2**30, 2)}


def _since(before: int | None) -> int | None:
    after = _alloc_retries()
    return None if before is None or after is None else after - before


def _profile(workload) -> dict:
    from torch.profiler import ProfilerActivity, profile

    device = workload.device
    _sync(device)
    begin = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        workload.step()
        _sync(device)
    wall_s = time.perf_counter() - begin
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    launches = [e for e in prof.events() if e.name in ("cudaLaunchKernel", "cuLaunchKernel",
                                                        "cudaLaunchKernelExC", "cuLaunchKernelEx")]
    replays = [e for e in prof.events() if e.name in ("cudaGraphLaunch",)]
    kernel_us = sum(_device_us(e) for e in kernels)
    return {"profiled_wall_s": wall_s, "gpu_kernels": len(kernels),
            "gpu_kernel_ms": kernel_us / 1e3, "kernel_launches": len(launches),
            "graph_launches": len(replays), "top_kernels": top_kernels(kernels)}


def _device_us(event) -> float:
    return event.device_time_total if hasattr(event, "device_time_total") else event.cuda_time_total


def top_kernels(kernels, count: int = TOP_KERNELS) -> list[dict]:
    """The kernels that took the most GPU time, by name: ``name`` (its first 160 characters),
    ``count`` and ``ms``, largest first."""
    by_name: dict[str, list[float]] = {}
    for event in kernels:
        by_name.setdefault(event.name[:160], []).append(_device_us(event))
    ranked = sorted(by_name.items(), key=lambda item: -sum(item[1]))[:count]
    return [{"name": name, "count": len(us), "ms": round(sum(us) / 1e3, 4)} for name, us in ranked]


def _step_times(workload, count: int) -> list[float]:
    """Wall seconds of ``count`` steps, each synchronised."""
    times = []
    for _ in range(count):
        begin = time.perf_counter()
        workload.step()
        _sync(workload.device)
        times.append(time.perf_counter() - begin)
    return times


def run(spec: str, params: dict, stack: list[str], warmup: int, steps: int) -> dict:
    row: dict = {"stack": stack}
    _free()  # dynamo reset with it
    row["memory_before"] = _memory()
    from torch._dynamo.utils import counters
    counters.clear()
    try:
        torch.manual_seed(0)
        workload = levers.Step(spec, params=params).workload()
        row["tokens_per_step"] = workload.tokens_per_step
        # a CPU run checks the path: dynamo's eager backend, not a C++ compile
        options = {"backend": "eager"} if workload.device.type != "cuda" else {}
        undos = _apply(workload, stack, options)
        first = _step_times(workload, warmup)
        retries = _alloc_retries()
        durations = _step_times(workload, steps)
        row.update(warmup_s=first, dur_s=durations, median_ms=1e3 * statistics.median(durations),
                   counters=_counters(), alloc_retries=_since(retries))
        row.update(_profile(workload))
        for undo in reversed(undos):
            undo()
        row["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - a failing variant is a result
        row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:800])
        traceback.print_exc()
    _free()
    return row


def _apply(workload, stack: list[str], options: dict) -> list:
    """A stack's levers (``levers.apply``), or a peer's transforms (``peer:...``, the KV cache
    off); returns the undos in the order they were made."""
    if not stack:
        return []
    if stack[0].startswith(PEER):
        undos = [training_cache_off(workload.model)]
        return undos + apply_peer(stack[0].removeprefix(PEER), workload, options)
    return [levers.apply(workload, stack, **options).undo]


def _levers(entry: str) -> list[str]:
    """A stack written as levers joined by '+'."""
    return [x for x in entry.split("+") if x]


def _stacks(text: str) -> list[list[str]]:
    """``--stacks``: eager first, then each entry, a peer's whole or its levers split on '+'."""
    stacks: list[list[str]] = [[]]
    for entry in (s.strip() for s in text.split(";")):
        if entry.startswith(PEER):
            stacks.append([entry])
        elif entry:
            stacks.append(_levers(entry))
    return stacks


def _write(summary: dict, out: Path) -> None:
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=1, default=str))


def ab(spec: str, params: dict, base: list[str], stack: list[str],
       sides: tuple[str, ...] = ("together",), forms: tuple[bool, ...] = (False, True)) -> list[dict]:
    """tune's A/B of ``stack`` against ``base``, as tune runs it and as the user runs it, with
    its sides run as each of ``sides`` says (together: alternating step by step, both built;
    one-at-a-time: each built, timed and freed alone; together:0.5, alternating in windows of
    about 0.5 s of steps)."""
    from levers.tune.measure import ab_measure

    rows = []
    for side_mode, as_run in ((m, r) for m in sides for r in forms):
        mode, _, window = side_mode.partition(":")
        measure = ab_measure(spec, params, sides=mode, window_s=float(window) if window else None)
        _free()
        row: dict = {"base": base, "stack": stack, "as_run": as_run, "sides": side_mode,
                      "memory_before": _memory()}
        retries = _alloc_retries()
        try:
            trial = measure(tuple(base), tuple(stack), None, as_run=as_run)
            row["alloc_retries"] = _since(retries)
            row["memory_after"] = _memory()
            row.update({k: v for k, v in trial.to_dict().items() if k in (
                "decision", "tokens_per_s_ratio", "tokens_per_s_ci95", "step_ms", "parity",
                "error", "phase_s", "timed_eager_random", "step_ms_each", "wall_s",
                "parity_note", "peak_allocated_bytes", "warnings")})
            row["status"] = "ok" if trial.error is None else "failed"
        except Exception as exc:  # noqa: BLE001 - a failing A/B is a result
            row.update(status="failed", error=f"{type(exc).__name__}: {exc}"[:800])
            traceback.print_exc()
        rows.append(row)
    _free()
    return rows


def _timed_row(summary: dict, item: str, spec: str, params: dict, stack: list[str], args,
               after_ab: bool) -> None:
    """One variant built fresh and timed (:func:`run`), its row written as it lands."""
    row = run(spec, params, stack, args.warmup, args.steps)
    row["after_ab"] = after_ab
    summary["models"][item]["rows"].append(row)
    print(item, stack or "eager", "(after the A/Bs)" if after_ab else "", row.get("status"),
          round(row.get("median_ms", 0), 2), "ms",
          {k: row.get(k) for k in ("gpu_kernel_ms", "kernel_launches", "graph_launches",
                                   "profiled_wall_s", "alloc_retries")},
          flush=True)
    _write(summary, args.out)


def _increments(summary: dict, item: str, spec: str, params: dict,
                increments: list[tuple[list[str], list[str]]], out: Path,
                sides: tuple[str, ...], as_run: tuple[bool, ...]) -> None:
    """Each increment's A/B (:func:`ab`), its rows written as they land."""
    trials = summary["models"][item].setdefault("ab", [])
    for base, stack in increments:
        for row in ab(spec, params, base, stack, sides, as_run):
            trials.append(row)
            print(item, "ab", row["sides"], base, ">", stack,
                  "as run" if row["as_run"] else "as tune",
                  row.get("status"), row.get("tokens_per_s_ratio"), row.get("step_ms"),
                  row.get("error") or "", flush=True)
            _write(summary, out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", required=True, help="SPEC@MODEL, comma-separated")
    parser.add_argument("--stacks", default="compile-model:backend=cudagraphs",
                        help="';'-separated stacks, each '+'-separated levers")
    parser.add_argument("--size", default="full")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--ab", default="", metavar="BASE>STACK",
                        help="';'-separated increments, each side '+'-joined levers: tune's A/B")
    parser.add_argument("--ab-sides", default="together",
                        help="','-separated: how each A/B runs its sides (together, "
                             "one-at-a-time, together:SECONDS for windows of steps), each in turn")
    parser.add_argument("--ab-as-tune-only", action="store_true",
                        help="each A/B as tune times it only, not compiled again as run")
    parser.add_argument("--stacks-after", default="", metavar="STACKS",
                        help="stacks timed again after the A/Bs, in the same process (whether "
                             "what the A/Bs left behind slows them), as --stacks")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    increments = []
    for entry in (e.strip() for e in args.ab.split(";") if e.strip()):
        if ">" not in entry:
            parser.error(f"--ab {entry!r}: write BASE>STACK (compile-blocks>compile-blocks+float8)")
        base, stack = entry.split(">", 1)
        increments.append((_levers(base), _levers(stack)))
    if args.stacks_after and not increments:
        parser.error("--stacks-after times stacks again after the A/Bs: name them with --ab")
    args.out.mkdir(parents=True, exist_ok=True)
    stacks = _stacks(args.stacks)
    stacks_after = _stacks(args.stacks_after)[1:]  # no second eager row
    summary = {"environment": _environment(), "command": " ".join(sys.argv), "models": {}}
    for item in args.models.split(","):
        spec, model = item.split("@", 1)
        params = model_params(spec, model, args.size, args.device)
        summary["models"][item] = {"params": params, "rows": []}
        for stack in stacks:
            _timed_row(summary, item, spec, params, stack, args, after_ab=False)
        if increments:
            _increments(summary, item, spec, params, increments, args.out,
                        tuple(m.strip() for m in args.ab_sides.split(",") if m.strip()),
                        (False,) if args.ab_as_tune_only else (False, True))
            for stack in stacks_after:
                _timed_row(summary, item, spec, params, stack, args, after_ab=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
