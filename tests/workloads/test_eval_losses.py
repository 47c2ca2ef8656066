"""The built-in language-model workloads' ``eval_losses``: a fixed held-out set, scored per
example, which ``levers ab`` pairs between the sides as its quality read."""

from __future__ import annotations

import json

import pytest
import torch

from levers.cli import main
from levers.workloads import _runtime, llama

QUICK = ["--steps", "4", "--warmup", "1", "--parity-steps", "2", "--resamples", "200"]


@pytest.mark.parametrize("name", ("llama", "hf"))
def test_the_held_out_losses_are_per_example_and_fixed_by_the_seed(name):
    if name == "hf":
        pytest.importorskip("transformers")
        from levers.workloads import hf as module
    else:
        module = llama
    workload = module.build()
    losses = workload.eval_losses()
    assert losses.shape == (_runtime.NUM_HELD_OUT,) and losses.dtype == torch.float32
    # a random init over a 512-token vocabulary scores near ln(512) = 6.24 on random tokens
    assert torch.all((losses > 5.5) & (losses < 7.0))
    assert len(set(losses.tolist())) == _runtime.NUM_HELD_OUT  # one loss per sequence
    assert torch.equal(module.build().eval_losses(), losses)
    assert not torch.equal(module.build(seed=1).eval_losses(), losses)
    # another batch size scores the same sequences, in other chunks
    assert torch.allclose(module.build(batch_size=5).eval_losses(), losses, rtol=1e-5)
    assert workload.model.training  # put back in training mode
    assert all(p.grad is None for p in workload.model.parameters())


def test_scoring_the_held_out_set_leaves_the_training_steps_as_they_were():
    scored, plain = llama.build(), llama.build()
    scored.eval_losses()
    first = [scored.step(), scored.step()]
    assert torch.equal(torch.stack(first), torch.stack([plain.step(), plain.step()]))
    # and training moves the held-out losses
    assert not torch.equal(scored.eval_losses(), llama.build().eval_losses())


def test_levers_ab_reads_the_held_out_loss_of_the_llama_workload(capsys, tmp_path):
    out_json = tmp_path / "r.json"
    code = main(["ab", "llama", "--lever", "autocast-bf16", *QUICK, "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 0, err
    quality = json.loads(out_json.read_text())["quality"]
    assert quality["num_examples"] == _runtime.NUM_HELD_OUT
    assert quality["verdict"] in ("PARITY", "IMPROVED", "DAMAGED")
    assert quality["note"] == f"{_runtime.NUM_HELD_OUT} held-out examples, paired"
    assert "quality (held-out loss, candidate - baseline)" in out
