"""Capture overhead: wall time of a captured step over a plain step.

The captured step is the one the capture times: in the two-pass mode (levers' default) the
timed pass, a step under the profiler alone; in the one-pass mode the step under the op
recorder, whose extra time on a GPU is about (number of aten ops) x (levers' host cost per op),
plus the profiler. For each shape this script builds the workload, runs warm-up steps, then
alternates plain, profiled-plain and captured steps, one per capture mode asked for
(``_capture_one``: one capture, as ``capture_step`` takes it after its warm-up), so drift hits
all alike. One JSON row per shape and mode goes to ``OUT_DIR/capture_overhead.jsonl``: commit,
torch version, device and GPU name, shapes, the mode, the median and p10/p90 of each kind of
step, the number of ops, the overhead ratios, the host cost per op and, for two passes, the
alignment's coverage and the time to end the timed pass and join the passes. ``--cprofile``
also writes one cProfile of a captured step per shape (``OUT_DIR/capture_profile_<shape>.txt``),
to see where the host time goes.

Shapes (``--shape``, default all three):
    llama-1b      the built-in ``hf`` llama at size=1b: batch 4, seq 2048, bf16 autocast, fused AdamW
    gpt2-medium8  transformers GPT-2 with n_layer=8, n_embd=1024, n_head=16: batch 8, seq 1024
    vit-b16       timm vit_base_patch16_224 (transformers ViT-B/16 when timm does not import):
                  batch 64, 224x224 images, 1000 classes
GPT-2 and ViT train under bf16 autocast with a fused AdamW, as the ``hf`` workload does.

Usage:
    python bench/capture_overhead.py --out OUT_DIR --cprofile            # GPU, all three shapes,
                                                                         # both modes
    python bench/capture_overhead.py --out OUT_DIR --smoke               # CPU, tiny shapes
    python bench/capture_overhead.py --out OUT_DIR --case "llama size=tiny"  # any workload spec
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import statistics
import sys
import time
from typing import Any, Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode

from levers import Workload
from levers.capture import capture_step, gpu, step as capture_step_module
from levers.capture.step import MODES
from levers.capture.timed import TimedPass
from levers.environment import environment
from levers.loader import load_workload, parse_set
from levers.output.atomic import atomic_write_text

SHAPES = ("llama-1b", "gpt2-medium8", "vit-b16")
LEARNING_RATE = 1e-4


def _capture_one(workload: Workload, mode: str | None = None) -> Any:
    """One capture of a workload whose step has already run, as ``capture_step`` captures it
    after its warm-up."""
    return capture_step(workload, warmup=0, timed=0, ran_before=True, mode=mode)


@contextlib.contextmanager
def _timing_post(stop_s: list[float], join_s: list[float]) -> Any:
    """Append the wall time of every timed pass's stop (the profiler ended, its events read)
    to ``stop_s`` and of every join of the two passes to ``join_s``: the post-processing the
    timed pass adds to the content pass's."""
    join, stop = capture_step_module.join_passes, TimedPass.stop

    def timed(function: Callable[..., Any], into: list[float]) -> Callable[..., Any]:
        def run(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args)
            finally:
                into.append(time.perf_counter() - t0)

        return run

    capture_step_module.join_passes = timed(join, join_s)
    TimedPass.stop = timed(stop, stop_s)
    try:
        yield
    finally:
        capture_step_module.join_passes = join
        TimedPass.stop = stop


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: timing boundary


def _autocast(device: torch.device) -> contextlib.AbstractContextManager:
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _adamw(model: torch.nn.Module) -> torch.optim.AdamW:
    return torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, fused=True)


# --- the three shapes --------------------------------------------------------------------------


# --host-bound: the same models at a batch so small that the GPU waits for the host, so a step's
# wall time is its host time and each observer's extra time is its host cost
HOST_BOUND = False


def llama_1b(device: torch.device, smoke: bool) -> tuple[Workload, dict[str, Any]]:
    params = {"arch": "llama", "attn": "sdpa", "device": str(device)}
    params.update({"size": "tiny"} if smoke else {"size": "1b", "batch_size": 4, "seq_len": 2048})
    if HOST_BOUND and not smoke:
        params.update(batch_size=1, seq_len=64)
    workload = load_workload("hf", params)
    return workload, dict(workload.params)


def gpt2_medium8(device: torch.device, smoke: bool) -> tuple[Workload, dict[str, Any]]:
    import text_workloads  # bench/text_workloads.py, beside this script

    size = "tiny" if smoke else "medium8"
    batch, seq = (1, 64) if HOST_BOUND and not smoke else (2 if smoke else 8, None)
    workload = text_workloads.gpt2(device=str(device), batch_size=batch, size=size, seq_len=seq)
    shape = dict(text_workloads.SIZES[size], batch=batch, seq=workload.params["seq_len"])
    return workload, {"model": type(workload.model).__name__, "attn": "sdpa", **shape}


def vit_b16(device: torch.device, smoke: bool) -> tuple[Workload, dict[str, Any]]:
    batch, image, classes = (2, 32, 10) if smoke else (64, 224, 1000)
    if HOST_BOUND and not smoke:
        batch = 1
    torch.manual_seed(0)
    try:
        import timm

        if smoke:
            make = lambda: timm.create_model(  # noqa: E731
                "vit_base_patch16_224", pretrained=False, img_size=image, depth=2,
                embed_dim=64, num_heads=4, num_classes=classes,
            )
        else:
            make = lambda: timm.create_model("vit_base_patch16_224", pretrained=False)  # noqa: E731
        source = "timm vit_base_patch16_224"
    except Exception:  # timm needs torchvision, which not every machine has
        import transformers

        config = transformers.ViTConfig(
            hidden_size=64 if smoke else 768, num_hidden_layers=2 if smoke else 12,
            num_attention_heads=4 if smoke else 12, intermediate_size=128 if smoke else 3072,
            image_size=image, patch_size=16, num_labels=classes,
        )
        make = lambda: transformers.ViTForImageClassification(config)  # noqa: E731
        source = "transformers ViTForImageClassification"
    with device:
        model = make()
    model.train()
    optimizer = _adamw(model)
    generator = torch.Generator(device=device).manual_seed(0)

    def logits_of(images: torch.Tensor) -> torch.Tensor:
        out = model(images)
        return out if isinstance(out, torch.Tensor) else out.logits

    def step() -> torch.Tensor:
        images = torch.randn(batch, 3, image, image, generator=generator, device=device)
        labels = torch.randint(0, classes, (batch,), generator=generator, device=device)
        with _autocast(device):
            loss = torch.nn.functional.cross_entropy(logits_of(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    workload = Workload(model=model, step=step, optimizer=optimizer, name="vit-b16",
                        tokens_per_step=batch, device=device)
    return workload, {"model": source, "batch": batch, "image": image, "classes": classes}


_BUILDERS: dict[str, Callable[[torch.device, bool], tuple[Workload, dict[str, Any]]]] = {
    "llama-1b": llama_1b,
    "gpt2-medium8": gpt2_medium8,
    "vit-b16": vit_b16,
}


# --- measuring ---------------------------------------------------------------------------------


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _summary(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {
        "median_s": statistics.median(xs),
        "p10_s": _quantile(xs, 0.1),
        "p90_s": _quantile(xs, 0.9),
        "min_s": min(xs),
        "n": len(xs),
    }


def _timed(workload: Workload, profiled: bool) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one plain step."""
    device = workload.device
    with gpu.kernel_profiler() if profiled else contextlib.nullcontext():
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        workload.step()
        _sync(device)
        return time.perf_counter() - t0, time.process_time() - c0


def measure(name: str, workload: Workload, shape: dict[str, Any], *, warmup: int, repeats: int,
            cprofile_path: str | None, modes: list[str]) -> list[dict[str, Any]]:
    """One row per capture mode, the modes' captures alternated with the plain steps."""
    device = workload.device
    on_cuda = device.type == "cuda"
    for _ in range(warmup):
        workload.step()
    for mode in modes:
        _capture_one(workload, mode)  # the first capture fills levers' caches
    plain_s: list[float] = []
    profiled_s: list[float] = []  # a plain step under the capture's profiler: its share alone
    # process CPU time: unlike wall time, not inflated by waiting for a core on a shared machine
    plain_cpu_s: list[float] = []
    per_mode = {mode: {
        "captured_s": [],  # capture_step end to end: the step(s) plus assembling records
        "step_only_s": [],  # the captured step alone, as the capture timed it
        "captured_cpu_s": [],  # capture_step end to end
        "step_only_cpu_s": [],  # the captured step alone (the last step capture_step ran)
        "stop_s": [],  # two passes: ending the profiler and reading the timed pass's events
        "join_s": [],  # two passes: joining the timed pass to the content pass
        "coverage": [],
        "num_kernels_to_neighbour": [],
    } for mode in modes}
    step = workload.step
    step_cpu_s = [0.0]

    def cpu_timed_step() -> Any:  # the step as capture_step calls it, timed in CPU time
        c0 = time.process_time()
        try:
            return step()
        finally:
            step_cpu_s[0] = time.process_time() - c0

    num_ops = num_kernels = 0
    for i in range(repeats):
        wall_s, cpu_s = _timed(workload, profiled=False)
        plain_s.append(wall_s)
        plain_cpu_s.append(cpu_s)
        if on_cuda:
            profiled_s.append(_timed(workload, profiled=True)[0])
        for mode in (modes if i % 2 == 0 else modes[::-1]):
            figures = per_mode[mode]
            t0, c0 = time.perf_counter(), time.process_time()
            workload.step = cpu_timed_step
            try:
                with _timing_post(figures["stop_s"], figures["join_s"]):
                    capture = _capture_one(workload, mode)
            finally:
                workload.step = step
            figures["captured_s"].append(time.perf_counter() - t0)
            figures["captured_cpu_s"].append(time.process_time() - c0)
            figures["step_only_cpu_s"].append(step_cpu_s[0])
            figures["step_only_s"].append(capture.timing.captured_step_s)
            if capture.passes.coverage is not None:
                figures["coverage"].append(capture.passes.coverage)
                figures["num_kernels_to_neighbour"].append(capture.passes.num_kernels_to_neighbour)
            num_ops, num_kernels = len(capture.ops), len(capture.kernels)
            del capture
    if cprofile_path is not None:
        _write_cprofile(workload, cprofile_path)
    env = environment(device)
    plain, plain_cpu = _summary(plain_s), _summary(plain_cpu_s)
    rows = []
    for mode, figures in per_mode.items():
        captured, step_only = _summary(figures["captured_s"]), _summary(figures["step_only_s"])
        captured_cpu = _summary(figures["captured_cpu_s"])
        step_only_cpu = _summary(figures["step_only_cpu_s"])
        rows.append({
            "bench": "capture_overhead",
            "shape": name,
            "mode": mode,
            "workload": workload.name,
            "params": shape,
            "num_ops": num_ops,
            "num_kernels": num_kernels,
            "tokens_per_step": workload.tokens_per_step,
            "plain": plain,
            "profiled_plain": _summary(profiled_s),
            "captured": captured,
            "captured_step_only": step_only,
            "overhead_ratio": captured["median_s"] / plain["median_s"],
            "step_only_overhead_ratio": step_only["median_s"] / plain["median_s"],
            # the captured step's extra time spread over its ops
            "per_op_host_us": (step_only["median_s"] - plain["median_s"]) / max(num_ops, 1) * 1e6,
            # the same from the fastest of each: steadier where other work shares the machine
            "per_op_host_us_min": (step_only["min_s"] - plain["min_s"]) / max(num_ops, 1) * 1e6,
            "plain_cpu_time": plain_cpu,
            "captured_cpu_time": captured_cpu,
            "captured_step_only_cpu_time": step_only_cpu,
            # process CPU time per op: of the captured step, and of capture_step end to end
            # (recording, timing and assembling the records)
            "per_op_step_cpu_us": (step_only_cpu["median_s"] - plain_cpu["median_s"])
            / max(num_ops, 1) * 1e6,
            "per_op_cpu_us": (captured_cpu["median_s"] - plain_cpu["median_s"])
            / max(num_ops, 1) * 1e6,
            "timed_pass_stop": _summary(figures["stop_s"]),
            "join": _summary(figures["join_s"]),
            "coverage": min(figures["coverage"], default=None),
            "num_kernels_to_neighbour": max(figures["num_kernels_to_neighbour"], default=None),
            "commit": env["levers_commit"],
            "torch": env["torch"],
            "device": env["device"],
            "device_name": env["device_name"],
            "cpu": env["cpu"],
            "num_cpus": env["num_cpus"],
            "torch_threads": torch.get_num_threads(),
            "load_average_1m": os.getloadavg()[0],  # other work on the machine skews host timings
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        })
    return rows


# --- where the captured step's extra time goes (--breakdown) -----------------------------------


class _EmptyMode(TorchDispatchMode):
    """A dispatch mode that only calls the op: the floor of any Python dispatch mode."""

    def __init__(self, marker: Callable[[int], Any] | None = None) -> None:
        super().__init__()
        self.marker = marker
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.marker is None:
            return func(*args, **kwargs)
        self.count += 1
        with self.marker(self.count):
            return func(*args, **kwargs)


class _EmptyModeUnguarded(TorchDispatchMode):
    """``_EmptyMode`` without torch's per-call guard that keeps dynamo out of the handler."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _recorder_stack(workload: Workload, profiler: Any = None, *, gc_off: bool = False,
                    ranges: bool = True) -> contextlib.ExitStack:
    """The capture's observers (levers.capture.step.StepCapture.start), under ``profiler`` (with
    the per-op ranges) or none."""
    from levers.capture.recorder import make_recorder
    from levers.capture.step import enter_observers

    recorder = make_recorder(workload.model, optimizer=workload.optimizer, live=None,
                             range_marker=gpu.range_marker() if profiler is not None and ranges
                             else None)
    stack = contextlib.ExitStack()
    if gc_off:
        stack.enter_context(_gc_off())
    if profiler is not None:
        stack.enter_context(profiler)
    enter_observers(stack, recorder, workload.optimizer)
    return stack


@contextlib.contextmanager
def _gc_off():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _kernels_profiler() -> Any:
    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])


def _variant_contexts(workload: Workload) -> dict[str, Callable[[], Any]]:
    on_cuda = workload.device.type == "cuda"
    variants: dict[str, Callable[[], Any]] = {
        "plain": contextlib.nullcontext,
        "empty dispatch mode": _EmptyMode,
        "empty dispatch mode, unguarded": _EmptyModeUnguarded,
        "observers, no profiler": lambda: _recorder_stack(workload),
        "observers, no profiler, gc off": lambda: _recorder_stack(workload, gc_off=True),
        "profiler (the timed pass)": lambda: gpu.timed_profiler(on_cuda),
    }
    if on_cuda:
        variants.update({
            "empty mode with op ranges": lambda: _EmptyMode(gpu.range_marker()),
            "profiler (kernels)": _kernels_profiler,
            "profiler (kernels + memory)": gpu.kernel_profiler,
            "profiler + empty mode": lambda: _stacked(gpu.kernel_profiler(), _EmptyMode()),
            "profiler + empty mode with op ranges": lambda: _stacked(
                gpu.kernel_profiler(), _EmptyMode(gpu.range_marker())),
            "observers + profiler (kernels)": lambda: _recorder_stack(
                workload, _kernels_profiler()),
            "observers + profiler, no op ranges": lambda: _recorder_stack(
                workload, gpu.kernel_profiler(), ranges=False),
            "observers + profiler (the capture)": lambda: _recorder_stack(
                workload, gpu.kernel_profiler()),
            "the capture, gc off": lambda: _recorder_stack(
                workload, gpu.kernel_profiler(), gc_off=True),
        })
    return variants


@contextlib.contextmanager
def _stacked(*managers: Any):
    with contextlib.ExitStack() as stack:
        for manager in managers:
            stack.enter_context(manager)
        yield


def breakdown(name: str, workload: Workload, *, warmup: int, repeats: int) -> dict[str, Any]:
    """Median wall and process CPU time of one step under each observer alone and stacked,
    alternated so that drift hits all alike."""
    device = workload.device
    for _ in range(warmup):
        workload.step()
    num_ops = len(_capture_one(workload).ops)
    variants = _variant_contexts(workload)
    wall: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(repeats):
        for variant, make in variants.items():
            with make():
                _sync(device)
                t0, c0 = time.perf_counter(), time.process_time()
                workload.step()
                _sync(device)
                wall[variant].append(time.perf_counter() - t0)
                cpu[variant].append(time.process_time() - c0)
    plain_wall = statistics.median(wall["plain"])
    rows = {}
    for variant in variants:
        median = statistics.median(wall[variant])
        rows[variant] = {
            "wall": _summary(wall[variant]),
            "cpu_median_s": statistics.median(cpu[variant]),
            "ratio": median / plain_wall,
            "extra_us_per_op": (median - plain_wall) / max(num_ops, 1) * 1e6,
        }
        print(f"  {name:14s} {variant:40s} {median * 1e3:8.2f} ms  {median / plain_wall:5.2f}x "
              f"{rows[variant]['extra_us_per_op']:6.1f} us/op", flush=True)
    env = environment(device)
    return {
        "bench": "capture_breakdown", "shape": name, "num_ops": num_ops, "variants": rows,
        "commit": env["levers_commit"], "torch": env["torch"], "device_name": env["device_name"],
        "cpu": env["cpu"], "load_average_1m": os.getloadavg()[0],
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _write_cprofile(workload: Workload, path: str) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    _capture_one(workload)
    profiler.disable()
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(40)
    atomic_write_text(path, text.getvalue())


def _append_row(path: str, row: dict[str, Any]) -> None:
    existing = open(path).read() if os.path.exists(path) else ""
    atomic_write_text(path, existing + json.dumps(row) + "\n")


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for capture_overhead.jsonl")
    parser.add_argument("--shape", action="append", choices=SHAPES,
                        help="a shape to measure (repeatable; default: all three)")
    parser.add_argument("--case", action="append", default=[],
                        help='a workload spec and --set items instead, e.g. "llama size=tiny"')
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes on the CPU (checks the script, not the figures)")
    parser.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's; 1 keeps CPU timings steady "
                        "on a shared machine)")
    parser.add_argument("--label", default=None,
                        help="a note stored in every row (e.g. which levers the rows measure)")
    parser.add_argument("--cprofile", action="store_true",
                        help="also write a cProfile of one captured step per shape")
    parser.add_argument("--host-bound", action="store_true",
                        help="the three shapes at batch 1 (and seq 64): the GPU waits for the "
                        "host, so the extra time is levers' host cost")
    parser.add_argument("--mode", action="append", choices=MODES,
                        help="a capture mode to measure (repeatable; default: both, paired)")
    parser.add_argument("--breakdown", action="store_true",
                        help="instead: time a step under each of the capture's observers alone "
                        "and stacked (rows to capture_breakdown.jsonl)")
    args = parser.parse_args(argv)
    global HOST_BOUND
    HOST_BOUND = args.host_bound
    device = torch.device(args.device or ("cpu" if args.smoke or not torch.cuda.is_available()
                                          else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU; use --smoke or --device cpu here")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    out_path = os.path.join(args.out, "capture_overhead.jsonl")

    jobs: list[tuple[str, Callable[[], tuple[Workload, dict[str, Any]]]]] = []
    for case in args.case:
        spec, *sets = case.split()
        jobs.append((case, lambda spec=spec, sets=sets: _case(spec, sets)))
    if not args.case or args.shape:
        for name in args.shape or SHAPES:
            jobs.append((name, lambda name=name: _BUILDERS[name](device, args.smoke)))

    for name, build in jobs:
        t0 = time.perf_counter()
        workload, shape = build()
        if args.breakdown:
            row = breakdown(name, workload, warmup=args.warmup, repeats=args.repeats)
            row.update(params=shape, smoke=args.smoke, label=args.label,
                       host_bound=args.host_bound)
            _append_row(os.path.join(args.out, "capture_breakdown.jsonl"), row)
            if args.cprofile:
                _write_cprofile(workload, os.path.join(args.out, f"capture_profile_{_slug(name)}.txt"))
            device_of = workload.device
            del workload
            _free(device_of)
            continue
        cprofile_path = (os.path.join(args.out, f"capture_profile_{_slug(name)}.txt")
                         if args.cprofile else None)
        rows = measure(name, workload, shape, warmup=args.warmup, repeats=args.repeats,
                       cprofile_path=cprofile_path, modes=args.mode or list(MODES))
        for row in rows:
            row["smoke"] = args.smoke
            row["label"] = args.label
            _append_row(out_path, row)
            profiled = row["profiled_plain"]
            join = row["join"]
            print(
                f"{name:28s} {row['mode']:8s} ops={row['num_ops']:6d} "
                f"plain={row['plain']['median_s'] * 1e3:8.2f} ms "
                + (f"profiled={profiled['median_s'] * 1e3:8.2f} ms " if profiled else "")
                + f"captured step={row['captured_step_only']['median_s'] * 1e3:8.2f} ms "
                f"({row['step_only_overhead_ratio']:.2f}x, {row['per_op_host_us']:.1f} us/op) "
                f"end to end={row['captured']['median_s'] * 1e3:8.2f} ms "
                f"({row['overhead_ratio']:.2f}x) cpu time/op: step {row['per_op_step_cpu_us']:.1f} "
                f"us, end to end {row['per_op_cpu_us']:.1f} us"
                + (f" stop={row['timed_pass_stop']['median_s'] * 1e3:.0f} ms "
                   f"join={join['median_s'] * 1e3:.0f} ms coverage={row['coverage']:.3f}"
                   if join else "")
                + f" [{time.perf_counter() - t0:.0f} s]",
                file=sys.stderr,
            )
        device_of = workload.device
        del workload
        _free(device_of)
    print(f"rows appended to {out_path}", file=sys.stderr)
    return 0


def _case(spec: str, sets: list[str]) -> tuple[Workload, dict[str, Any]]:
    workload = load_workload(spec, parse_set(sets))
    return workload, dict(workload.params)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


if __name__ == "__main__":
    sys.exit(main())
