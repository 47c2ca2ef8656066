"""levers audit under torchrun (gloo, 2 ranks on the CPU): the merged report has both ranks, a
DDP-wrapped workload shows its buckets, and a rank that raises, hangs or dies ends the run with
its name, every rank exiting non-zero, within the timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "ddp_workloads.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
# the longest a run may take on a loaded 2-core machine: far above the timeouts given below
RUN_LIMIT_S = 240

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not TORCHRUN.exists(), reason="torchrun is not installed beside python"),
]


def torchrun(tmp_path: Path, *levers_args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "levers", "audit", *levers_args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
    )


def test_demo_merged_report_has_both_ranks(tmp_path):
    out = tmp_path / "audit.json"
    run = torchrun(tmp_path, "demo", "--timed", "1", "--json", str(out), "--md", str(tmp_path / "a.md"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert "Ranks: 2 of 2 answered" in run.stdout
    # rank 1 printed nothing: one audit, rank 0's
    assert run.stdout.count("Findings (") == 1
    assert "levers: error" not in run.stderr
    data = json.loads(out.read_text())
    merged = data["distributed"]
    assert [r["rank"] for r in merged["ranks"]] == [0, 1]
    assert merged["missing"] == [] and merged["failures"] == []
    assert all(r["error"] is None and r["median_step_s"] > 0 for r in merged["ranks"])
    assert data["settings"]["distributed"]["world_size"] == 2
    assert data["settings"]["distributed"]["strategy"] is None
    assert "## Ranks (2 of 2 answered)" in (tmp_path / "a.md").read_text()


def test_ddp_workload_reports_buckets_and_scale_findings(tmp_path):
    out = tmp_path / "audit.json"
    run = torchrun(
        tmp_path,
        f"{FIXTURES}:ddp",
        "--set",
        "bucket_cap_mb=0.001",
        "find_unused=True",
        "--json",
        str(out),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out.read_text())
    ranks = data["distributed"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        # two Linear(32, 32), 2 x 4224 bytes of gradients, in buckets of a 1048-byte cap (how
        # DDP groups the tensors is its own: after its first step, in gradient-ready order)
        sizes = [b["bytes"] for b in r["buckets"]]
        assert sum(sizes) == 2 * 4224 and len(sizes) >= 2, sizes
        assert r["distributed"]["ddp"]["find_unused_parameters"] is True
        assert {c["name"] for c in r["collectives"]} == {"allreduce"}
    settings = data["settings"]["distributed"]
    assert settings["strategy"] == "ddp" and settings["world_size"] == 2
    assert settings["backend"] == "gloo"
    codes = {f["code"] for f in data["audit"]["findings"]}
    assert "DIST002" in codes  # every parameter gets a gradient
    assert "DDP bucket all-reduce" in run.stdout
    assert "DDP's own timing of iteration" in run.stdout


def test_a_rank_that_raises_is_named(tmp_path):
    run = torchrun(tmp_path, f"{FIXTURES}:raise_on_rank", "--dist-timeout", "20")
    assert run.returncode != 0
    assert "rank 1 raised ValueError: boom on rank 1" in run.stdout + run.stderr
    assert "levers: error: rank 1: the step of workload 'raises' raised ValueError" in run.stderr


def test_a_hung_rank_is_named_within_the_timeout(tmp_path):
    run = torchrun(tmp_path, f"{FIXTURES}:hang_on_rank", "--dist-timeout", "5")
    assert run.returncode != 0
    assert "levers: error: rank 1 did not answer within 5 s" in run.stderr


def test_a_rank_that_dies_ends_the_run(tmp_path):
    run = torchrun(tmp_path, f"{FIXTURES}:exit_on_rank", "--dist-timeout", "20")
    assert run.returncode != 0
    # torchrun's own failure report names the rank and its exit code
    assert "exitcode  : 17" in run.stderr and "rank      : 1" in run.stderr


def test_ab_under_torchrun_gives_one_verdict_from_rank_0(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    out = tmp_path / "ab.json"
    run = subprocess.run(
        [str(TORCHRUN), "--standalone", "--nproc_per_node=2", "-m", "levers", "ab", "demo",
         "--set-b", "fixed=all", "--steps", "4", "--warmup", "1", "--parity-steps", "1",
         "--resamples", "200", "--json", str(out), "--dist-timeout", "60"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_LIMIT_S,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("decision:") == 1  # rank 1 printed nothing
    assert "step times are the slowest of 2 ranks" in run.stdout
    document = json.loads(out.read_text())
    assert len(document["samples"]["baseline"]["dur_ms"]) == 4
