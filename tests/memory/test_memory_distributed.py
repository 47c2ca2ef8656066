"""levers memory --world-size N --strategy ddp|zero1|fsdp2: one rank's peak, worked out by hand
from the single-rank prediction (whose categories tests/memory/test_memory_accounting.py checks)."""

from __future__ import annotations

import math

import memory_factories as factories
import pytest

from levers.cli import main
from levers.hardware import resolve_gpu
from levers.memory.distributed import model_bytes, per_rank, predict_per_rank
from levers.memory.options import MemoryOptions
from levers.memory.prediction import source_of

MIB = 1 << 20
H100 = resolve_gpu("h100-80gb")
# the mlp factory's parameters: 2048 + 128 + 512 + 16 bytes; at the peak, in 512-byte blocks
MLP_PARAM_BYTES = 2704
AT_PEAK = {"parameters": 3584, "gradients": 3584, "optimizer": 2 * 3584 + 4 * 512}


@pytest.fixture(scope="module")
def mlp_plan():
    options = MemoryOptions(gpu=H100, margin=0.05, num_steps=2, world_size=2, strategy="ddp")
    _, plan, rank = predict_per_rank(source_of(factories.mlp), options)
    return plan, rank.model


def test_the_model_bytes_and_its_units(mlp_plan):
    _, model = mlp_plan
    assert (model.parameter_bytes, model.trainable_bytes) == (MLP_PARAM_BYTES, MLP_PARAM_BYTES)
    # Linear, ReLU, Linear are no repeated blocks: one FSDP unit, the root
    assert (model.largest_unit, model.largest_unit_bytes, model.num_units) == (
        "(root)",
        MLP_PARAM_BYTES,
        1,
    )


def test_ddp_adds_the_reducer_buckets(mlp_plan):
    plan, model = mlp_plan
    assert {c.category: c.nbytes for c in plan.by_category}.items() >= AT_PEAK.items()
    rank = per_rank(plan, model, world_size=4, strategy="ddp")
    assert rank.by_category["ddp_buckets"] == MLP_PARAM_BYTES
    assert rank.peak_allocated_bytes == plan.peak_allocated_bytes + MLP_PARAM_BYTES
    assert (
        rank.peak_reserved_bytes - rank.peak_allocated_bytes
        == plan.peak_reserved_bytes - plan.peak_allocated_bytes
    )


def test_zero1_shards_the_optimizer_state(mlp_plan):
    plan, model = mlp_plan
    rank = per_rank(plan, model, world_size=4, strategy="zero1")
    assert rank.by_category["optimizer"] == 9216 // 4
    assert rank.peak_allocated_bytes == plan.peak_allocated_bytes - 9216 + 2304 + MLP_PARAM_BYTES


def test_fsdp2_shards_everything_and_adds_its_buffers(mlp_plan):
    plan, model = mlp_plan
    rank = per_rank(plan, model, world_size=3, strategy="fsdp2")
    other = plan.peak_allocated_bytes - sum(AT_PEAK.values())
    assert rank.by_category == {
        "parameters": math.ceil(3584 / 3),
        "gradients": math.ceil(3584 / 3),
        "optimizer": 9216 // 3,
        "other": other,
        "allgather_buffers": 2 * MLP_PARAM_BYTES,
        "reduce_scatter_buffers": MLP_PARAM_BYTES,
    }
    assert rank.peak_allocated_bytes == sum(rank.by_category.values())
    assert rank.method == "analytic"


def test_fsdp2_units_are_the_repeated_blocks():
    # 4 blocks of Linear(8, 32) and Linear(32, 8) without bias: 512 float32 each
    model = factories.Stack(width=8, depth=4)
    units = model_bytes(model)
    assert (units.largest_unit, units.largest_unit_bytes, units.num_units) == ("blocks.0", 2048, 4)
    model.blocks[0].up.weight.requires_grad_(False)
    assert model_bytes(model).trainable_bytes == 4 * 2048 - 256 * 4


def test_bad_strategy_and_world_size_refused(mlp_plan):
    plan, model = mlp_plan
    with pytest.raises(ValueError, match="strategy must be one of ddp, zero1, fsdp2"):
        per_rank(plan, model, world_size=2, strategy="zero3")
    with pytest.raises(ValueError, match="world size must be at least 1"):
        per_rank(plan, model, world_size=0, strategy="ddp")


def test_cli_prints_and_writes_the_per_rank_plan(tmp_path, capsys):
    import json

    spec = f"{factories.__file__}:mlp"
    out = tmp_path / "plan.json"
    code = main(
        ["memory", spec, "--no-whatifs", "--steps", "2", "--world-size", "2", "--strategy",
         "fsdp2", "--json", str(out)]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Per rank · fsdp2 on 2 ranks (analytic" in printed
    rank = json.loads(out.read_text())["extra"]["per_rank"]
    assert rank["strategy"] == "fsdp2" and rank["world_size"] == 2
    assert rank["by_category"]["allgather_buffers"] == 2 * MLP_PARAM_BYTES


def test_cli_refuses_a_strategy_without_a_world_size(capsys):
    assert main(["memory", "demo", "--strategy", "zero1"]) == 2
    assert "--strategy needs --world-size N" in capsys.readouterr().err
