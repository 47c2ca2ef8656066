"""What-ifs: re-predicted with the change, or computed on the recorded trace."""

from __future__ import annotations

import memory_factories as factories

from levers.memory.gpus import resolve_gpu
from levers.memory.predict import run_prediction, source_of
from levers.memory.whatif import (
    bf16_optimizer_sizes,
    bf16_optimizer_states,
    checkpointing,
    find_blocks,
    valid_row_fraction,
    valid_rows_loss,
)

H100 = resolve_gpu("h100-80gb")


def test_checkpointing_every_block_drops_the_activations():
    source = source_of(factories.stack, {"batch_size": 4096, "width": 256, "depth": 4})
    base = run_prediction(source, H100, num_steps=2)
    whatif = checkpointing(source, H100, base, num_steps=2)
    assert whatif.applicable and "4 blocks" in whatif.method
    # each block keeps x, relu(up(x)) (4x wider) for backward: 4096*256*4*(1+4) bytes a block
    assert whatif.delta_allocated_bytes < -2 * 4096 * 256 * 4 * 5


def test_blocks_are_the_members_of_a_module_list_of_one_class():
    model = factories.stack(depth=3).model
    assert [name for name, _ in find_blocks(model)] == ["blocks.0", "blocks.1", "blocks.2"]


def test_bf16_optimizer_states_halve_the_float32_state():
    base = run_prediction(source_of(factories.mlp, {}), H100, num_steps=2)
    sizes = bf16_optimizer_sizes(base.trace)
    before = sum(base.trace.allocations[h - 1].nbytes for h in sizes)
    assert before == 2 * 2704  # exp_avg and exp_avg_sq; the step counters stay float32
    assert sum(sizes.values()) == 2704
    whatif = bf16_optimizer_states(base)
    assert whatif.applicable and whatif.delta_allocated_bytes < 0


def test_valid_rows_use_the_targets_the_step_made():
    demo = run_prediction(source_of("demo", {"size": "tiny"}), H100, num_steps=1)
    assert valid_row_fraction(demo.trace) == 0.5  # half of the demo's suffix rows are padding
    whatif = valid_rows_loss(demo)
    assert whatif.applicable and whatif.delta_allocated_bytes <= 0
    llama = run_prediction(source_of("llama", {"size": "tiny"}), H100, num_steps=1)
    assert valid_row_fraction(llama.trace) == 1.0
    assert not valid_rows_loss(llama).applicable
