"""What-ifs: re-predicted with the change, or computed on the recorded trace."""

from __future__ import annotations

import json

import memory_factories as factories
import pytest
import torch
from torch.utils.checkpoint import checkpoint

from levers.memory.fake import trace_workload
from levers.hardware import resolve_gpu
from levers.memory.prediction import run_prediction, source_of
from levers.blocks import repeated_blocks
from levers.memory.whatif import (
    bf16_optimizer_sizes,
    bf16_optimizer_states,
    checkpointing,
    int8_moment_nbytes,
    int8_optimizer_states,
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


class CheckpointedCall(torch.nn.Module):
    """Checkpoints a block through its module call, as model code does."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False)


def test_backward_runs_on_the_standin():
    # Tensor.backward is a torch function, which a mode runs with itself off the stack
    trace, workload = trace_workload(
        lambda: factories.attention_stack(device="cuda"), H100, num_steps=1
    )
    assert workload.params["seen"] == {"grad_is_cuda": True}
    assert [call.backend for call in trace.sdpa_calls] == ["cudnn"] * 3


def test_checkpointing_recomputes_code_outside_submodules_like_the_forward():
    # each block's SDPA runs in a plain method; recomputed without the stand-in it would pick
    # the CPU kernel and save other tensors than the forward did
    source = source_of(factories.attention_stack, {})
    base = run_prediction(source, H100, num_steps=2)
    whatif = checkpointing(source, H100, base, num_steps=2)
    assert whatif.applicable and whatif.method == "re-prediction with 3 blocks wrapped"
    assert whatif.delta_allocated_bytes < 0

    def checkpoint_calls(workload) -> None:
        blocks = workload.model.blocks
        for index, block in enumerate(blocks):
            blocks[index] = CheckpointedCall(block)

    by_call = run_prediction(source, H100, num_steps=2, transform=checkpoint_calls)
    assert whatif.peak_allocated_bytes == by_call.replay.peak_allocated_bytes
    assert whatif.peak_reserved_bytes == by_call.replay.peak_reserved_bytes


def test_checkpointing_the_demo_predicts_its_own_checkpointing_fix():
    # batch 16: at the default batch of 2 the tiny demo is mostly cuBLAS workspace, and
    # recomputation in backward costs more than the activations it drops
    source = source_of("demo", {"size": "tiny", "batch_size": 16})
    base = run_prediction(source, H100, num_steps=2)
    whatif = checkpointing(source, H100, base, num_steps=2)
    assert whatif.applicable, whatif.note
    assert whatif.method == "re-prediction with 4 blocks wrapped"  # vision.blocks, text.layers
    assert whatif.delta_allocated_bytes < 0
    fixed = run_prediction(
        source.with_params(fixed="checkpointing"), H100, num_steps=2
    )  # the demo's own fix checkpoints the same blocks in the model code
    assert whatif.peak_allocated_bytes == fixed.replay.peak_allocated_bytes
    assert whatif.peak_reserved_bytes == fixed.replay.peak_reserved_bytes


def test_checkpointing_llama_saves_activations():
    source = source_of("llama", {"size": "tiny"})
    base = run_prediction(source, H100, num_steps=2)
    whatif = checkpointing(source, H100, base, num_steps=2)
    assert whatif.applicable, whatif.note
    assert whatif.method == "re-prediction with 2 blocks wrapped"
    assert whatif.delta_allocated_bytes < 0


def test_blocks_are_the_members_of_a_module_list_of_one_class():
    model = factories.stack(depth=3).model
    assert [block.path for block in repeated_blocks(model)] == ["blocks.0", "blocks.1", "blocks.2"]


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


@pytest.mark.slow
def test_the_audit_takes_mem001s_headroom_from_the_demos_whatif(capsys, tmp_path):
    from levers.cli import main

    findings = tmp_path / "findings.json"
    argv = ["audit", "demo", "--warmup", "0", "--timed", "1", "--select", "MEM001"]
    argv += ["--set", "batch_size=16", "--findings-json", str(findings)]
    assert main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "predicted by levers memory for h100-80gb (re-prediction with 4 blocks wrapped;" in out
    (finding,) = json.loads(findings.read_text())["findings"]
    predicted = finding["details"]["predicted"]
    assert finding["details"]["headroom_source"] == "levers memory"
    assert predicted["checkpointing_applicable"] is True
    assert finding["details"]["headroom_bytes"] == -predicted["checkpointing_delta_allocated_bytes"]
    assert finding["details"]["headroom_bytes"] > 0


def test_a_sequential_of_blocks_is_checkpointed_block_by_block():
    # timm keeps its blocks in an nn.Sequential: the what-if wraps each of them, and not the
    # Sequential inside a block (the MLP's Linear, GELU, Linear are of several classes)
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))
    try:
        import vit_like
    finally:
        sys.path.pop(0)
    assert [block.path for block in repeated_blocks(vit_like.VisionTransformer())] == [
        "blocks.0", "blocks.1", "blocks.2",
    ]
    from levers.workload import Workload

    def vit_on(device: str = "cpu") -> Workload:
        # the fixture's model, moved to the device the memory model asks for
        model = vit_like.VisionTransformer().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            # enough tokens that the activations, not the fixed costs, set the peak
            patches = torch.randn(256, 64, 48, device=device)
            labels = torch.zeros(256, dtype=torch.long, device=device)
            torch.nn.functional.cross_entropy(model(patches), labels).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return Workload(model=model, step=step, optimizer=optimizer, name="vit-like")

    source = source_of(vit_on, {})
    base = run_prediction(source, H100, num_steps=2)
    whatif = checkpointing(source, H100, base, num_steps=2)
    assert whatif.applicable, whatif.note
    assert whatif.method == "re-prediction with 3 blocks wrapped"
    assert whatif.delta_allocated_bytes < 0


def test_int8_optimizer_states_quantize_the_large_moments_only():
    # the mlp's moments are 2704 bytes (676 values): under torchao's 4096, so none shrinks
    base = run_prediction(source_of(factories.mlp, {}), H100, num_steps=2)
    whatif = int8_optimizer_states(base)
    assert not whatif.applicable and whatif.lever == "adamw-8bit"
    assert whatif.note == (
        "no float32 optimizer moments in the step of 4096 values or more, in multiples of 256"
    )
    assert int8_moment_nbytes((512, 64)) == 512 * 64 + 4 * 128 + 1024
    assert int8_moment_nbytes((64,)) is None and int8_moment_nbytes((4097,)) is None


@pytest.mark.parametrize("lever_id", ("adamw-bf16-state", "adamw-8bit"))
def test_the_state_whatifs_predict_the_state_their_lever_keeps_after_a_step(lever_id, monkeypatch):
    """The predicted change of the state (on the GPU's trace, fake tensors) against the state
    the lever keeps after a real step on a CPU (torchao's update run eagerly)."""
    pytest.importorskip("torchao.optim")
    import levers
    from levers.levers._optimizer_state import state_nbytes
    from levers.workloads import llama

    base = run_prediction(source_of("llama", {"size": "tiny"}), H100, num_steps=2)
    whatif = bf16_optimizer_states if lever_id == "adamw-bf16-state" else int8_optimizer_states
    predicted = whatif(base)
    assert predicted.applicable and predicted.lever == lever_id
    assert f"(lever {lever_id}; state -" in predicted.method
    assert predicted.delta_allocated_bytes < 0

    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    fp32, on = llama.build(), llama.build()
    levers.apply(on, lever_id)
    fp32.step(), on.step()
    measured = state_nbytes(on.optimizer, moments_only=True) - state_nbytes(
        fp32.optimizer, moments_only=True
    )
    assert measured < 0
    assert abs(predicted.delta_state_bytes - measured) <= 0.01 * abs(measured)


def test_a_masked_lm_s_drawn_targets_price_its_valid_rows_and_its_lever():
    # transformers' BertForMaskedLM with the zoo's batches: 15% of the tokens drawn as targets
    # each step. The draw is made on the host, so the rows with a target are known: the
    # valid-rows what-if applies, and loss-valid-rows is predicted with the rows it takes
    pytest.importorskip("transformers")
    import levers

    step = levers.Step("zoo", {"model": "bert", "size": "full", "batch_size": 4})
    plain = step.memory(gpu="h100-80gb", whatifs=True)
    lever = step.memory(gpu="h100-80gb", whatifs=False, lever_ids=["loss-valid-rows"])
    whatif = next(w for w in plain.whatifs if w.name == "valid-rows-loss")
    assert whatif.applicable and whatif.delta_allocated_bytes < 0, whatif.note
    assert "levers_skipped" not in lever.extra
    assert lever.peak_allocated_bytes < plain.peak_allocated_bytes
    # the what-if scales the vocabulary-wide tensors to the drawn share, the lever takes those
    # rows (padded to a bucket): the two agree on what goes
    saved_lever = plain.peak_allocated_bytes - lever.peak_allocated_bytes
    assert saved_lever == pytest.approx(-whatif.delta_allocated_bytes, rel=0.1)
    assert any("random draws" in note for note in lever.assumptions)
