"""bench/parity_sensitivity.py: its rounding noise (zero noise changes nothing; bf16-sized noise
moves a step by rounding's order, the parameters perturbed alike wherever one step reads them, the
optimizer's update untouched) and one architecture end to end."""

from __future__ import annotations

import json

import pytest
import torch
from bench_module import bench_module

pytest.importorskip("transformers")


def _bench():
    return bench_module("parity_sensitivity.py", "bench_parity_sensitivity")


def _tiny():
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)

    class W:
        pass

    w = W()
    w.model = model

    def step():
        x = torch.randn(32, 8)
        loss = (model(x) - x.sum(-1, keepdim=True)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    w.step = step
    return w


def test_zero_noise_changes_nothing_and_bf16_noise_moves_the_step_by_rounding():
    bench = _bench()
    plain = bench.run_steps(_tiny, 3, 0, None)
    assert bench.run_steps(_tiny, 3, 0, None) == plain  # the runs repeat themselves
    unit, bench.BF16_UNIT = bench.BF16_UNIT, 0.0
    try:
        assert bench.run_steps(_tiny, 3, 0, 1) == plain
    finally:
        bench.BF16_UNIT = unit
    noisy = bench.run_steps(_tiny, 3, 0, 1)
    moved = [abs(n - p) / p for n, p in zip(noisy[0] + noisy[1], plain[0] + plain[1])]
    assert all(0 < m < 0.05 for m in moved), moved


def test_a_parameter_read_twice_in_a_step_is_perturbed_alike():
    bench = _bench()
    weight = torch.nn.Parameter(torch.randn(4, 4))
    mode = bench.RoundingNoise(0.5, 0, {weight.data_ptr()})
    with mode:
        first, second = weight + 0, weight + 0
    assert not torch.equal(first, weight.detach())  # the output and the read were perturbed
    assert len(mode.read) == 1  # one perturbed copy of the weight for the whole step


def test_an_architecture_end_to_end(tmp_path):
    bench = _bench()
    assert bench.main(["--only", "llama", "--draws", "2", "--out", str(tmp_path)]) == 0
    (row,) = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert row["verdict"] == "PARITY" and row["error"] is None
    assert {(c["step"], c["quantity"]) for c in row["checks"]} == {
        (1, "loss"), (1, "grad_norm"), (3, "loss"), (3, "grad_norm")}
    assert all(len(c["S"]) == 2 and max(c["S"]) > 0 for c in row["checks"])
    assert "| PARITY | 1 |" in (tmp_path / "summary.md").read_text()
