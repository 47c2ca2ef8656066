"""Benchmark: could the parity gate's floor for a lower-precision candidate be measured on the step
itself? (issue 33: tolerances by numerics class)

The gate judges autocast-bf16 against an fp32 baseline by the float64 run with bf16's fixed floor
(1% after step 1, 2% after step K), since the fp32 baseline's own error shows no bf16 rounding.
The arch sweep (``bench/results/arch_sweep_cpu``) read it DAMAGED on 30 of 337 architectures,
mostly small convolutional nets with BatchNorm at batch 2. This measures, per architecture, how
far rounding of bf16's size moves the same steps: the baseline (fp32) run again from its seed
with every op's floating output, and each parameter as the step reads it (once per step, as
autocast casts a weight once), multiplied by ``1 + u * (r - 0.5)``, ``u = 2**-8``, ``r`` uniform
in [0, 1) from a generator of its own (the step's own random numbers are untouched); the
optimizer's update runs unperturbed. ``S``, the sensitivity at a check, is the largest of
``--draws`` such runs' relative distance to the unperturbed one; the autocast-bf16 candidate's
error against the float64 run (``c``) comes from the sweep's own contract
(``bench/arch_sweep.py``'s ``contract``), run here again. A floor of ``3 S`` (the gate's margin)
would be usable if ``c / S`` sat in a narrow band, whatever the architecture.

    LEVERS_TORCHVISION_WITHOUT_OPS=1 python bench/parity_sensitivity.py --only timm:rexnet_100,llama \\
        --out bench/results/parity_sensitivity_cpu
    # the architectures the sweep read DAMAGED under autocast-bf16, and a seeded sample of PARITY
    python bench/parity_sensitivity.py --from-sweep 30 --out ...

Writes ``OUT/results.jsonl`` (one row per architecture: the sweep's verdict, each check's ``c``
and the ``S`` of each draw) and ``OUT/summary.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("LEVERS_TORCHVISION_WITHOUT_OPS", "1")  # see bench/arch_sweep.py

import arch_sweep as sweep  # noqa: E402  (its builds, seed, parity steps and contract)

from levers.ab.gradnorm import grad_norm_probe  # noqa: E402
from levers.ab.parity import reference_for  # noqa: E402
from levers.ab.reference import optimizer_steps_outside  # noqa: E402
from levers.levers import load_all  # noqa: E402
from levers.output.atomic import atomic_write_text  # noqa: E402
from levers.vocab import CHANGES_NUMERICS  # noqa: E402

BF16_UNIT = 2.0**-8
LEVER = "autocast-bf16"
MARGIN = 3.0
aten = torch.ops.aten
# ops whose output is a copy, a selection or a comparison of their inputs' values: no rounding
_EXACT = {
    aten.cat, aten.stack, aten.clone, aten.index_select, aten.gather, aten.embedding, aten.index,
    aten.masked_fill, aten.where, aten.relu, aten.max, aten.min, aten.amax, aten.amin,
    aten.max_pool2d_with_indices, aten.max_pool2d_with_indices_backward, aten.constant_pad_nd,
    aten.repeat, aten.flip, aten.roll, aten.zeros_like, aten.ones_like, aten.empty_like,
    aten.full_like, aten.scalar_tensor, aten.lift_fresh_copy, aten.slice_scatter,
    aten.select_scatter, aten.new_zeros, aten.new_ones, aten.new_empty, aten.zeros, aten.ones,
    aten.full, aten.empty, aten.copy, aten.neg, aten.abs, aten.threshold_backward,
    aten.embedding_dense_backward, aten.arange, aten.hardtanh, aten.sign, aten.logical_not,
}


class RoundingNoise(TorchDispatchMode):
    """Every computed floating output, and each parameter as an op reads it, times
    ``1 + unit * (r - 0.5)``; views, in-place ops and value copies are left alone."""

    def __init__(self, unit: float, seed: int, params: set[int]) -> None:
        super().__init__()
        self.unit, self.seed, self.params = unit, seed, params
        self.suspended = 0  # > 0 while an optimizer steps (optimizer_steps_outside)
        self.generators: dict[torch.device, torch.Generator] = {}
        self.read: dict[int, torch.Tensor] = {}  # a parameter's perturbed copy, once per step

    def _noise(self, t: torch.Tensor) -> torch.Tensor:
        if t.device not in self.generators:
            self.generators[t.device] = torch.Generator(device=t.device).manual_seed(self.seed)
        r = torch.rand(t.shape, generator=self.generators[t.device], device=t.device,
                       dtype=t.dtype)
        return t * (1 + self.unit * (r - 0.5))

    def _param(self, t: Any) -> Any:
        if not (isinstance(t, torch.Tensor) and t.is_floating_point()):
            return t
        key = t.data_ptr()
        if key not in self.params:
            return t
        if key not in self.read:
            self.read[key] = self._noise(t)
        return self.read[key]

    def _output(self, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
            return self._noise(t)
        return t

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        schema = func._schema
        plain = not self.suspended and not schema.is_mutable
        if plain:
            args, kwargs = tree_map(self._param, args), tree_map(self._param, kwargs)
        out = func(*args, **kwargs)
        if not plain or func.overloadpacket in _EXACT or any(r.alias_info for r in schema.returns):
            return out
        return tree_map(self._output, out)


def run_steps(build: Callable[[], Any], steps: int, seed: int,
              noise_seed: int | None) -> tuple[list[float], list[float]]:
    """Loss and grad norm after each step of a fresh build, with rounding noise or without."""
    torch.manual_seed(seed)
    workload = build()
    params = {p.data_ptr() for p in workload.model.parameters()}
    losses, norms = [], []
    with grad_norm_probe(workload.model) as take:
        for step in range(1, steps + 1):
            torch.manual_seed(seed + step)  # the sides' batches and dropout, as the gate draws
            if noise_seed is None:
                loss = workload.step()
            else:
                mode = RoundingNoise(BF16_UNIT, noise_seed * 1000 + step, params)
                with mode, optimizer_steps_outside(mode):
                    loss = workload.step()
            losses.append(float(loss))  # sync point (untimed)
            norms.append(float(take()))  # sync point (untimed)
    return losses, norms


def _distance(value: float, to: float) -> float:
    return abs(value - to) / abs(to) if to else abs(value - to)


def measure(name: str, draws: int) -> dict[str, Any]:
    model, task = sweep.split_arch(name)
    task = sweep.arch.resolve_task(model, task)
    build = sweep.builder(model, task)
    steps, seed = sweep.PARITY_STEPS, sweep.SEED
    cached: list[Any] = []

    def reference() -> Any:
        if not cached:
            cached.append(reference_for(lambda: sweep.seeded(build), num_steps=steps,
                                        exactness=CHANGES_NUMERICS, seed=seed)[0])
        return cached[0]

    started = time.perf_counter()
    row = sweep.contract(build, load_all()[LEVER], {}, reference=reference, parity_steps=steps)
    parity = row.get("parity") or {}
    plain = run_steps(build, steps, seed, None)
    noisy = [run_steps(build, steps, seed, d) for d in range(draws)]
    checks = []
    for check in parity.get("checks", ()):
        if check.get("candidate_error") is None:
            continue
        i, k = check["step"] - 1, 0 if check["quantity"] == "loss" else 1
        checks.append({"step": check["step"], "quantity": check["quantity"],
                       "c": check["candidate_error"], "allowed": check["allowed_error"],
                       "S": [_distance(n[k][i], plain[k][i]) for n in noisy]})
    return {"arch": name, "verdict": parity.get("verdict"), "error": row.get("error"),
            "checks": checks, "seconds": round(time.perf_counter() - started, 1)}


def _ratios(rows: list[dict[str, Any]]) -> list[float]:
    return [c["c"] / max(c["S"]) for r in rows for c in r["checks"] if max(c["S"]) > 0]


def _with_sensitivity(row: dict[str, Any]) -> bool:
    """Whether every check would pass were ``MARGIN x S`` added to its allowance (the gate's
    ``MARGIN x`` the baseline's error ``+`` the floor): the rounding the fp32 baseline cannot
    show, counted as the baseline's error is."""
    return all(c["c"] <= c["allowed"] + MARGIN * max(c["S"]) for c in row["checks"])


def summary(rows: list[dict[str, Any]], header: str) -> str:
    lines = ["# Parity of autocast-bf16 against the step's own sensitivity to bf16 rounding", "",
             header, "",
             "| sweep verdict | architectures | c / S: min | median | max | "
             "all checks pass with 3 S added |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for verdict in ("DAMAGED", "PARITY"):
        mine = [r for r in rows if r["verdict"] == verdict and r["checks"]]
        ratios = sorted(_ratios(mine))
        if not ratios:
            continue
        lines.append(f"| {verdict} | {len(mine)} | {ratios[0]:.3g} | "
                     f"{statistics.median(ratios):.3g} | {ratios[-1]:.3g} | "
                     f"{sum(map(_with_sensitivity, mine))} |")
    lines += ["", "| architecture | verdict | check | c | S (each draw) | c / max S |",
              "| --- | --- | --- | ---: | --- | ---: |"]
    for r in rows:
        for c in r["checks"]:
            s = max(c["S"])
            lines.append(f"| {r['arch']} | {r['verdict']} | {c['quantity']} after step "
                         f"{c['step']} | {c['c']:.3g} | {', '.join(f'{x:.3g}' for x in c['S'])}"
                         f" | {c['c'] / s if s else float('inf'):.3g} |")
    return "\n".join(lines) + "\n"


def from_sweep(count: int, seed: int) -> list[str]:
    """The sweep's autocast-bf16 DAMAGED architectures and a seeded sample of ``count`` PARITY."""
    rows = sweep.read_rows(ROOT / "bench/results/arch_sweep_cpu/results.jsonl")
    last = {r["arch"]: r for r in rows if r.get("lever") == LEVER and r.get("parity")}
    damaged = sorted(a for a, r in last.items() if r["parity"]["verdict"] == "DAMAGED")
    held = sorted(a for a, r in last.items() if r["parity"]["verdict"] == "PARITY")
    return damaged + random.Random(seed).sample(held, min(count, len(held)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", help="architectures, comma-separated (arch_sweep's names)")
    parser.add_argument("--from-sweep", type=int, metavar="N",
                        help="the sweep's DAMAGED architectures and N of its PARITY ones")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if bool(args.only) == (args.from_sweep is not None):
        parser.error("give --only or --from-sweep")
    names = args.only.split(",") if args.only else from_sweep(args.from_sweep, args.seed)
    versions = sweep.versions()
    header = ", ".join(f"{k} {versions[k]}" for k in ("torch", "transformers", "timm", "commit"))
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for index, name in enumerate(names, 1):
        try:
            row = measure(name, args.draws)
        except Exception as exc:  # noqa: BLE001 - an architecture that fails is a result
            row = {"arch": name, "verdict": None, "error": repr(exc)[:300], "checks": []}
        rows.append({**row, **versions})
        atomic_write_text(args.out / "results.jsonl",
                          "".join(json.dumps(r, default=str) + "\n" for r in rows))
        atomic_write_text(args.out / "summary.md", summary(rows, header))
        print(f"[{index}/{len(names)}] {name}: {row['verdict']} ({row.get('seconds')} s)",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
