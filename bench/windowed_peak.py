"""The windowed peak on a GPU: it tracks a planted one-off spike, then falls back.

A small MLP trains for ``--steps`` steps under :class:`levers.RunGuard` with a window of
``--window`` steps. At ``--spike-step`` the loop allocates and frees one ``--spike-gib`` GiB
tensor (a one-off transient, like a checkpoint load or one long batch). Expected:

- the window that holds the spike peaks at (what was allocated when it came + the spike),
  above every other window;
- the next window falls back to the steady peak;
- the lifetime peak (kept on the host, what an unreset ``max_memory_allocated()`` would show)
  stays at the spike for the rest of the run.

Writes ``OUT/windowed_peak.json`` (git commit, torch version, GPU name, shapes, one row per
window, the checks) and ``OUT/run.record.jsonl`` (the guard's own record). Takes well under a
minute on an H200.

Usage (GPU machine, repository root):

    python bench/windowed_peak.py --out bench/results/windowed_peak_h200
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for the results")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--window", type=int, default=25)
    parser.add_argument("--spike-step", type=int, default=140)
    parser.add_argument("--spike-gib", type=float, default=8.0)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    if not torch.cuda.is_available():
        print("windowed_peak needs a CUDA device: the windowed peak is the CUDA allocator's")
        return 2
    from levers.runs.guards import RunGuard
    from levers.environment import levers_commit_id
    from levers.output.atomic import atomic_write_text

    args.out.mkdir(parents=True, exist_ok=True)
    record = args.out / "run.record.jsonl"
    if record.exists():
        record.unlink()  # one run per output directory
    device = torch.device("cuda")
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.hidden, args.hidden), torch.nn.GELU()]
    model = torch.nn.Sequential(*layers).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    x = torch.randn(args.batch, args.hidden, device=device)
    spike_numel = int(args.spike_gib * GIB) // 4

    windows = []
    guard = RunGuard(
        window_steps=args.window,
        record=record,
        device=device,
        log=lambda e: windows.append(e) if e["event"] == "window" else None,
    )
    started = time.perf_counter()
    with guard:
        for step in range(1, args.steps + 1):
            loss = model(x).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step == args.spike_step:
                allocated_before_spike = torch.cuda.memory_allocated(device)
                spike = torch.empty(spike_numel, dtype=torch.float32, device=device)
                spike.fill_(1.0)  # the one-off transient
                del spike
            guard.step(step, loss=loss)
    torch.cuda.synchronize()
    wall_s = time.perf_counter() - started

    spike_index = next(
        i for i, w in enumerate(windows) if w["first_step"] <= args.spike_step <= w["last_step"]
    )
    steady = [w["window_peak_bytes"] for i, w in enumerate(windows) if i not in (0, spike_index)]
    steady_median = statistics.median(steady)
    spike_window = windows[spike_index]
    after = windows[spike_index + 1 :]
    spike_bytes = spike_numel * 4
    checks = {
        # the spike window holds what was allocated when the spike came, plus the spike
        "spike_window_tracks_spike": spike_window["window_peak_bytes"]
        >= allocated_before_spike + spike_bytes
        and spike_window["window_peak_bytes"] > max(steady),
        # every later window is back to the steady peak (within 1 MiB)
        "windows_after_fall_back": bool(after)
        and all(abs(w["window_peak_bytes"] - steady_median) <= MIB for w in after),
        # the lifetime peak stays at the spike
        "lifetime_peak_stays": bool(after)
        and all(w["lifetime_peak_bytes"] == spike_window["window_peak_bytes"] for w in after),
    }
    result = {
        "bench": "windowed_peak",
        "command": "python bench/windowed_peak.py " + " ".join(
            sys.argv[1:] if argv is None else argv,
        ),
        "git_commit": levers_commit_id(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(device),
        "shapes": {
            "hidden": args.hidden,
            "batch": args.batch,
            "layers": args.layers,
            "steps": args.steps,
            "window_steps": args.window,
            "spike_step": args.spike_step,
            "spike_bytes": spike_bytes,
        },
        "allocated_before_spike_bytes": allocated_before_spike,
        "startup_peak_bytes": None
        if guard.startup_memory is None
        else guard.startup_memory.window_peak_bytes,
        "steady_window_peak_bytes": {
            "median": steady_median,
            "min": min(steady),
            "max": max(steady),
        },
        "median_step_ms": statistics.median(w["median_step_s"] for w in windows[1:]) * 1e3,
        "wall_s": wall_s,
        "windows": [
            {
                k: w[k]
                for k in (
                    "first_step",
                    "last_step",
                    "window_peak_bytes",
                    "lifetime_peak_bytes",
                    "median_step_s",
                )
            }
            for w in windows
        ],
        "checks": checks,
        "passed": all(checks.values()),
    }
    atomic_write_text(args.out / "windowed_peak.json", json.dumps(result, indent=2) + "\n")
    for w in windows:
        print(
            f"steps {w['first_step']:>4}-{w['last_step']:<4} window peak "
            f"{w['window_peak_bytes'] / GIB:7.3f} GiB   "
            f"lifetime {w['lifetime_peak_bytes'] / GIB:7.3f} GiB"
        )
    print(json.dumps(checks), f"wall {wall_s:.1f} s")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
