"""The catalogue's rows of the numerics-changing levers proven by a quality read, not a timing.

Reads what ``bench/optimizer_state.py`` (``optimizer_state.json``: the held-out loss paired over
``--steps``, the optimizer state measured and predicted) and ``levers ab --json`` with
``--steps N`` (``ab.json``: its held-out-loss quality read) wrote, and writes one catalogue row
per lever (:mod:`levers.levers.catalogue`) with its quality read and memory change; their step
times are left out ("tokens/s not timed") when the run that made them shared the GPU, which
``--contended`` says.

    python bench/quality_catalogue.py --out bench/results/levers_catalogue_quality --contended \
        --optimizer-state bench/results/optimizer_state_h200/bf16_optimizer_state.json \
        --optimizer-state bench/results/optimizer_state_h200/8bit_optimizer_state.json \
        --optimizer-state bench/results/optimizer_state_cpu/optimizer_state.json \
        --ab float8=bench/results/float8_quality_h200/ab.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from levers.output.atomic import atomic_write_text  # noqa: E402

CONTENDED = "its step time was taken beside other jobs on the machine and is not shown"


def _read(difference: float, low: float, high: float, verdict: str, what: str) -> str:
    return f"{what}: {difference:+.1e} [{low:+.1e}, {high:+.1e}] {verdict}"


def _change(delta: float, whole: float) -> str:
    """``-50.0% (-3.55 GiB)``; MiB under a GiB."""
    unit, scale = ("GiB", 2**30) if abs(delta) >= 2**30 else ("MiB", 2**20)
    return f"{delta / whole:+.1%} ({delta / scale:+.2f} {unit})"


def _difference(value: float | None, base: float | None) -> float | None:
    return None if value is None or base is None else value - base  # None: a CPU run


def optimizer_state_rows(doc: dict[str, Any], contended: bool) -> list[dict[str, Any]]:
    meta, rows = doc["meta"], {r["variant"]: r for r in doc["rows"]}
    base = rows["fp32-fused"]
    out = []
    for lever, paired in doc["paired"].items():
        final = paired["held_out_loss_vs_fp32_final"]
        reads = paired["held_out_loss_vs_fp32"].values()
        verdicts = ", ".join(f"{sum(r['verdict'] == v for r in reads)} {v}"
                             for v in ("PARITY", "IMPROVED", "DAMAGED") if any(r["verdict"] == v for r in reads))
        low, high = final["ci95"]
        quality = _read(final["difference"], low, high, final["verdict"],
                        f"held-out loss after {meta['steps']} steps vs fp32 AdamW")
        moments = base["state_moment_bytes"]
        quality += (f" (every {meta['eval_every']} steps: {verdicts}); optimizer moments "
                    f"{_change(paired['state_moment_bytes_vs_fp32'], moments)}, levers memory "
                    f"predicted {_change(paired['predicted_delta_state_bytes'], moments)}")
        out.append({
            "lever": lever, "levers": [lever], "workload": meta["workload"],
            "shape": " ".join(f"{k}={v}" for k, v in meta["params"].items() if k != "device"),
            "baseline": "fp32-fused", "gpu": meta["gpu"], "torch": meta["torch"],
            "commit": meta["commit"], "date": meta["date"], "status": "ok",
            "tokens_per_s_ratio": None if contended else paired["step_ms_ratio_vs_fp32"] ** -1,
            "tokens_per_s_ratio_ci95": None,
            "peak_allocated_delta_bytes": _difference(rows[lever]["peak_allocated_bytes"],
                                                      base["peak_allocated_bytes"]),
            "peak_reserved_delta_bytes": None, "peak_allocated_delta_ci95": None, "error": None,
            "quality": quality, "note": CONTENDED if contended else None,
        })
    return out


def ab_row(lever: str, doc: dict[str, Any], contended: bool) -> dict[str, Any]:
    quality, env, config = doc["quality"], doc["environment"], doc["config"]
    ci = quality["ci"]
    reads = {r["name"]: r for r in doc["reads"]}
    peak = reads.get("peak_allocated")
    base = doc["baseline"]
    return {
        "lever": lever, "levers": [lever], "workload": base["spec"],
        "shape": " ".join(f"{k}={v}" for k, v in base["params"].items() if k != "device"),
        "baseline": "the same step without it",
        "gpu": env["device_name"], "torch": env["torch"], "commit": env["levers_commit"],
        "date": doc["started_at"], "status": "ok", "tokens_per_s_ratio": None,
        "tokens_per_s_ratio_ci95": None,
        "peak_allocated_delta_bytes": (peak["candidate"]["median"] - peak["baseline"]["median"]) if peak else None,
        "peak_reserved_delta_bytes": None, "peak_allocated_delta_ci95": None, "error": None,
        "quality": _read(ci["difference"], ci["lo"], ci["hi"], quality["verdict"],
                         f"held-out loss after {config['num_steps']} steps "
                         f"({quality['num_examples']} sequences, paired)"),
        "note": CONTENDED if contended else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory of catalogue.json")
    parser.add_argument("--optimizer-state", type=Path, action="append", default=[])
    parser.add_argument("--ab", action="append", default=[], help="LEVER=path/to/ab.json")
    parser.add_argument("--contended", action="store_true",
                        help="the runs shared the GPU: leave their step times out")
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    for path in args.optimizer_state:
        rows += optimizer_state_rows(json.loads(path.read_text(encoding="utf-8")), args.contended)
    for spec in args.ab:
        lever, _, path = spec.partition("=")
        if not path:
            raise SystemExit(f"--ab {spec}: expected LEVER=path/to/ab.json")
        rows.append(ab_row(lever, json.loads(Path(path).read_text(encoding="utf-8")), args.contended))
    if not rows:
        raise SystemExit("nothing to read: give --optimizer-state or --ab")
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"rows": rows, "command": " ".join(sys.argv)}
    atomic_write_text(args.out / "catalogue.json", json.dumps(doc, indent=2) + "\n")
    print(f"wrote {len(rows)} rows to {args.out / 'catalogue.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
