"""A factory without a `device` parameter (the README's own example) is predicted as a GPU run,
or refused; never a FITS for memory that was not counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from levers.cli import main
from levers.errors import LeversError
from levers.memory import predict_memory

README = Path(__file__).parents[1] / "fixtures" / "readme_workload.py"
HIDDEN, BATCH = 4096, 64


def test_the_readme_factory_counts_weights_gradients_and_adamw_state_as_gpu_memory():
    plan = predict_memory(f"{README}:factory", "80GiB", params={"hidden": HIDDEN, "batch_size": BATCH})
    weight_bytes = 4 * (HIDDEN * HIDDEN + HIDDEN + HIDDEN * 10 + 10)
    # parameters, their gradients and AdamW's two moments are all live after the first step
    assert plan.peak_allocated_bytes >= 4 * weight_bytes
    categories = {c.category: c.nbytes for c in plan.by_category}
    # four parameter tensors, each rounded up to the allocator's 512-byte blocks
    assert weight_bytes <= categories["parameters"] < weight_bytes + 4 * 512
    assert any("takes no device parameter" in a for a in plan.assumptions)


def test_the_readme_factory_does_not_fit_in_a_budget_smaller_than_its_weights(capsys):
    code = main(
        ["memory", f"{README}:factory", "--set", f"hidden={HIDDEN}", f"batch_size={BATCH}",
         "--gpu", "64MiB", "--no-whatifs"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "FITS" not in out.replace("DOES NOT FIT", "")
    assert "DOES NOT FIT" in out


def test_parameters_kept_on_the_cpu_are_refused_with_how_to_pass_the_device():
    with pytest.raises(LeversError, match="add a `device` parameter to the factory"):
        predict_memory(f"{README}:pinned_to_cpu", "80GiB")


def test_module_to_with_a_device_keyword_books_the_parameters_on_the_gpu():
    # model.to(device="cuda", dtype=...) parses its arguments through a torch function; left
    # rewritten to the CPU, the parameters and the optimizer state were not counted at all
    import memory_factories as factories

    plan = predict_memory(factories.attention_stack, "h100-80gb")
    categories = {c.category: c.nbytes for c in plan.by_category}
    width, depth = 256, 3
    assert categories["parameters"] == depth * 4 * width * width * 2  # bf16, 512-aligned
    assert categories["optimizer"] > 2 * categories["parameters"]  # two bf16 moments and the step counts
