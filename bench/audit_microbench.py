"""Microbenchmarks of the demo's three headline kernels at ``size=1b``, now and fixed.

The agreement check for ``levers audit``'s measured costs: the same shapes and dtypes the demo
runs under bf16 autocast on a GPU, timed here with their own CUDA-event loop (not levers' cost
code), forward and forward+backward, per call:

- suffix attention: the demo's ``suffix_attention`` (dense mask, enable_gqa) pinned without
  cuDNN (MATH) and with cuDNN admitted; also each backend alone;
- ViT attention: the demo's ``eager_attention`` against SDPA with the padding mask and without
  it (flash);
- RMSNorm: the demo's ``rms_norm_eager`` against ``F.rms_norm`` on the prefix and suffix shapes.

Each is timed two ways: a CUDA-event loop (wall time on the GPU, launch gaps included) and the
summed durations of the kernels one call runs, read from the profiler. The audit's measured costs
are kernel device time, so the agreement check compares kernel time with kernel time; small
kernels launched one by one from Python (the suffix's norms, the MATH attention path) spend more
time in launch gaps than in kernels, which only the event loop sees.

Every backend that cannot run here is reported as unavailable (with the reason), never a crash.
One JSON row per measurement (commit, torch, GPU, case, variant, shape, pass, median and spread).
With ``--audit-json`` (the file of ``levers audit demo --set device=cuda size=1b
--findings-json FILE``)
it also prints the audit's per-call "now" and "fixed" figures next to these and whether they
agree within 25%.

Usage (GPU):
    levers audit demo --set device=cuda size=1b --findings-json /tmp/audit.json
    python bench/audit_microbench.py --audit-json /tmp/audit.json \
        --out bench/results/audit_microbench_h200.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from levers.environment import levers_commit_id
from levers.audit.cost.microbench import input_leaves
from levers.workloads.demo_config import SIZES
from levers.workloads.demo_text import rms_norm_eager, suffix_attention
from levers.workloads.demo_vision import eager_attention

TOLERANCE = 0.25
WARMUP, SAMPLES, ITERS = 5, 15, 5
DEVICE = "cuda"  # --device cpu runs the same code with a host timer: a smoke test, not a result


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()  # sync point: benchmark boundary


def _gpu_name() -> str:
    return torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"


def time_us(fn: Callable[[], None]) -> dict:
    """Median and spread (min, p10, p90, max) of one call, in microseconds, or why not."""
    try:
        for _ in range(WARMUP):
            fn()
        _sync()
        per_call = []
        for _ in range(SAMPLES):
            if DEVICE == "cuda":
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(ITERS):
                    fn()
                end.record()
                end.synchronize()  # sync point: read one sample
                per_call.append(start.elapsed_time(end) * 1e3 / ITERS)
            else:
                t0 = time.perf_counter()
                for _ in range(ITERS):
                    fn()
                per_call.append((time.perf_counter() - t0) * 1e6 / ITERS)
    except Exception as exc:  # noqa: BLE001 - a backend this build or GPU lacks must not end the run
        if DEVICE == "cuda":
            torch.cuda.empty_cache()
        first_line = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return {"unavailable": f"{type(exc).__name__}: {first_line}"}
    xs = sorted(per_call)
    return {
        "median_us": statistics.median(xs),
        "min_us": xs[0],
        "p10_us": xs[max(0, int(0.1 * (len(xs) - 1)))],
        "p90_us": xs[int(0.9 * (len(xs) - 1))],
        "max_us": xs[-1],
        "samples": len(xs),
        "iters": ITERS,
    }


def passes(make_out: Callable[[], torch.Tensor]) -> dict[str, Callable[[], None]]:
    grads: dict[tuple, torch.Tensor] = {}

    def forward() -> None:
        with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
            make_out()

    def forward_backward() -> None:
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            out = make_out()
        # gradients of the inputs, not accumulated into .grad: inside a training step these
        # flow on to the ops before; an incoming gradient made once, as an upstream op's would be
        key = (tuple(out.shape), out.dtype)
        if key not in grads:
            grads[key] = torch.ones_like(out)
        torch.autograd.grad(out, input_leaves(out), grads[key])

    return {"fwd": forward, "fwd+bwd": forward_backward}


def kernel_us(fn: Callable[[], None]) -> dict:
    """Device time of the kernels one call runs (summed kernel durations from the profiler,
    median over samples): the quantity the audit's measured costs add up, free of the launch
    gaps a CUDA-event loop also counts when kernels are small."""
    if DEVICE != "cuda":
        return {}
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    try:
        per_call = []
        for _ in range(SAMPLES // 3):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(ITERS):
                    fn()
                _sync()
            total_ns = sum(
                e.end_ns() - e.start_ns()
                for e in prof.profiler.kineto_results.events()
                if e.device_type() != DeviceType.CPU
                and not (getattr(e, "is_user_annotation", lambda: False)())
            )
            per_call.append(total_ns / 1e3 / ITERS)
    except Exception as exc:  # noqa: BLE001 - a backend this build or GPU lacks must not end the run
        return {"kernel_unavailable": f"{type(exc).__name__}: {str(exc)[:200]}"}
    xs = sorted(per_call)
    return {"kernel_median_us": statistics.median(xs), "kernel_min_us": xs[0], "kernel_max_us": xs[-1]}


def randn(*shape: int, dtype: torch.dtype, grad: bool = True) -> torch.Tensor:
    return torch.randn(*shape, device=DEVICE, dtype=dtype).requires_grad_(grad)


def suffix_cases(cfg) -> list[tuple[str, str, dict, Callable[[], torch.Tensor]]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    b, h, kv, e = cfg.batch_size, cfg.text_heads, cfg.text_kv_heads, cfg.head_dim
    t, s = cfg.suffix_len, cfg.prefix_len + cfg.suffix_len
    q = randn(b, h, t, e, dtype=torch.bfloat16)
    k, v = (
        randn(b, kv, s, e, dtype=torch.bfloat16),
        randn(b, kv, s, e, dtype=torch.bfloat16),
    )
    mask = torch.zeros(1, 1, t, s, device=DEVICE)
    shape = {
        "q": list(q.shape),
        "kv": list(k.shape),
        "mask": list(mask.shape),
        "dtype": "bfloat16",
        "enable_gqa": True,
    }
    cases = [
        (
            "now",
            "pinned [FLASH, EFFICIENT, MATH] (demo)",
            lambda: suffix_attention(q, k, v, mask, admit_cudnn=False),
        ),
        (
            "fixed",
            "pinned [CUDNN, FLASH, EFFICIENT, MATH] (demo fix)",
            lambda: suffix_attention(q, k, v, mask, admit_cudnn=True),
        ),
    ]
    for name in ("MATH", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            continue

        def only(backend=backend):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask.to(q.dtype), enable_gqa=True
                )

        cases.append((f"only {name}", f"sdpa_kernel([{name}])", only))
    return [
        ("suffix_attention", variant, {**shape, "how": how}, fn)
        for variant, how, fn in cases
    ]


def vit_cases(cfg) -> list[tuple[str, str, dict, Callable[[], torch.Tensor]]]:
    b, h, p = cfg.batch_size, cfg.vit_heads, cfg.num_patches
    e = cfg.vit_width // h
    q, k, v = (randn(b, h, p, e, dtype=torch.bfloat16) for _ in range(3))
    valid = torch.ones(b, p, dtype=torch.bool, device=DEVICE)
    shape = {"q": list(q.shape), "dtype": "bfloat16"}
    return [
        (
            "vit_attention",
            "now",
            {**shape, "how": "eager_attention (demo)"},
            lambda: eager_attention(q, k, v, valid),
        ),
        (
            "vit_attention",
            "fixed",
            {**shape, "how": "SDPA with the padding mask"},
            lambda: F.scaled_dot_product_attention(
                q, k, v, attn_mask=valid[:, None, None, :]
            ),
        ),
        (
            "vit_attention",
            "fixed flash",
            {**shape, "how": "SDPA without a mask (flash)"},
            lambda: F.scaled_dot_product_attention(q, k, v),
        ),
    ]


def norm_cases(cfg) -> list[tuple[str, str, dict, Callable[[], torch.Tensor]]]:
    out = []
    counts = {
        "prefix": 2 * (cfg.text_layers - 1) + 1,
        "suffix": 2 * cfg.text_layers + 1,
    }
    for part, length in (("prefix", cfg.prefix_len), ("suffix", cfg.suffix_len)):
        x = randn(cfg.batch_size, length, cfg.text_width, dtype=torch.float32)
        w = torch.ones(cfg.text_width, device=DEVICE, requires_grad=True)
        shape = {"x": list(x.shape), "dtype": "float32", "calls_per_step": counts[part]}
        out.append(
            (
                f"rms_norm {part}",
                "now",
                {**shape, "how": "rms_norm_eager (demo)"},
                lambda x=x, w=w: rms_norm_eager(x, w, cfg.norm_eps),
            )
        )
        out.append(
            (
                f"rms_norm {part}",
                "fixed",
                {**shape, "how": "F.rms_norm"},
                lambda x=x, w=w: F.rms_norm(x, w.shape, w.to(x.dtype), cfg.norm_eps),
            )
        )
    return out


def run(size: str) -> list[dict]:
    cfg = SIZES[size]
    base = {
        "commit": levers_commit_id(),
        "torch": torch.__version__,
        "gpu": _gpu_name(),
        "cudnn": torch.backends.cudnn.version() if DEVICE == "cuda" else None,
        "size": size,
    }
    rows = []
    for case, variant, shape, make in (
        suffix_cases(cfg) + vit_cases(cfg) + norm_cases(cfg)
    ):
        for pass_name, fn in passes(make).items():
            row = {
                **base,
                "case": case,
                "variant": variant,
                "pass": pass_name,
                "shape": shape,
                **time_us(fn),
            }
            if "median_us" in row:
                row.update(kernel_us(fn))
            rows.append(row)
            if "median_us" in row:
                shown = f"{row['median_us']:.1f} us (p10 {row['p10_us']:.1f}, p90 {row['p90_us']:.1f})"
                if "kernel_median_us" in row:
                    shown += f"; kernels {row['kernel_median_us']:.1f} us"
            else:
                shown = f"unavailable: {row['unavailable']}"
            print(f"{case:20s} {variant:14s} {pass_name:8s} {shown}", flush=True)
    return rows


def _bench(rows: list[dict], case: str, variant: str) -> float | None:
    """Kernel time of one fwd+bwd call (event time where kernel time is unavailable)."""
    for r in rows:
        if r["case"] == case and r["variant"] == variant and r["pass"] == "fwd+bwd":
            return r.get("kernel_median_us", r.get("median_us"))
    return None


def agreement(rows: list[dict], audit_path: Path) -> list[dict]:
    """The audit's per-call now/fixed (ms) against these per-call fwd+bwd medians."""
    data = json.loads(audit_path.read_text())
    audit = data.get(
        "audit", data
    )  # a --findings-json file, or a capture file carrying one
    by_code: dict[str, list[dict]] = {}
    for f in audit["findings"]:
        by_code.setdefault(f["code"], []).append(f)

    def pick(code: str, needle: str) -> dict | None:
        for f in by_code.get(code, []):
            if needle in f["receipts"][0]["file"] or needle in f["receipts"][0]["code"]:
                return f
        return None

    norm_now = sum(
        (_bench(rows, f"rms_norm {p}", "now") or float("nan")) * n
        for p, n in _norm_counts(rows)
    )
    norm_fixed = sum(
        (_bench(rows, f"rms_norm {p}", "fixed") or float("nan")) * n
        for p, n in _norm_counts(rows)
    )
    checks = [
        (
            "suffix attention (per call)",
            pick("ATTN001", "scaled_dot_product_attention"),
            "per_call",
            _bench(rows, "suffix_attention", "now"),
            _bench(rows, "suffix_attention", "fixed"),
        ),
        (
            "ViT attention (per call)",
            pick("ATTN002", "demo_vision"),
            "per_call",
            _bench(rows, "vit_attention", "now"),
            _bench(rows, "vit_attention", "fixed"),
        ),
        (
            "RMSNorm (per step)",
            pick("NORM001", "demo_text"),
            "per_step",
            norm_now,
            norm_fixed,
        ),
    ]
    out = []
    for label, finding, scope, bench_now, bench_fixed in checks:
        cost = (finding or {}).get("cost") or {}
        key_now, key_fixed = (
            ("per_call_now_ms", "per_call_fixed_ms")
            if scope == "per_call"
            else ("now_ms", "fixed_ms")
        )
        audit_now = cost.get(key_now)
        audit_fixed = cost.get(key_fixed)
        row = {
            "check": label,
            "audit_now_us": None if audit_now is None else audit_now * 1e3,
            "audit_fixed_us": None if audit_fixed is None else audit_fixed * 1e3,
            "bench_now_us": bench_now,
            "bench_fixed_us": bench_fixed,
            "audit_provenance": cost.get("provenance"),
            "audit_fixed_provenance": cost.get("fixed_provenance"),
        }
        for side in ("now", "fixed"):
            a, b = row[f"audit_{side}_us"], row[f"bench_{side}_us"]
            row[f"{side}_ratio"] = None if not a or not b else a / b
            row[f"{side}_agrees"] = (
                None
                if row[f"{side}_ratio"] is None
                else abs(row[f"{side}_ratio"] - 1) <= TOLERANCE
            )
        out.append(row)
        print(
            f"{label:28s} audit now {_fmt(row['audit_now_us'])} us / bench {_fmt(bench_now)} us "
            f"(ratio {_fmt(row['now_ratio'], 2)}, agrees {row['now_agrees']}); "
            f"fixed {_fmt(row['audit_fixed_us'])} / {_fmt(bench_fixed)} us "
            f"(ratio {_fmt(row['fixed_ratio'], 2)}, agrees {row['fixed_agrees']})"
        )
    return out


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _norm_counts(rows: list[dict]) -> list[tuple[str, int]]:
    counts = {}
    for r in rows:
        if r["case"].startswith("rms_norm ") and r["variant"] == "now":
            counts[r["case"].split()[1]] = r["shape"]["calls_per_step"]
    return sorted(counts.items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1b", choices=sorted(SIZES))
    parser.add_argument(
        "--out", type=Path, required=True, help="JSON lines file to write"
    )
    parser.add_argument(
        "--audit-json",
        type=Path,
        help="levers audit --findings-json file to compare with",
    )
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="cpu: a smoke test of this script",
    )
    args = parser.parse_args(argv)
    global DEVICE
    DEVICE = args.device
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(
            "audit_microbench needs a CUDA GPU (or --device cpu for a smoke test)",
            file=sys.stderr,
        )
        return 2
    rows = run(args.size)
    if args.audit_json is not None:
        for check in agreement(rows, args.audit_json):
            rows.append(
                {
                    "case": "agreement",
                    **check,
                    "torch": torch.__version__,
                    "gpu": _gpu_name(),
                    "commit": levers_commit_id(),
                }
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
