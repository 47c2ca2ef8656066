"""The checkpointing what-if of a model that keeps a KV cache in training (use_cache on)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.memory import predict_memory  # noqa: E402

SPEC = f"{Path(__file__).parents[1] / 'fixtures' / 'hf_cache_workload.py'}:factory"


def test_checkpointing_a_model_with_use_cache_on_is_predicted_without_the_cache():
    plan = predict_memory(SPEC, "h100-80gb", whatifs=True, num_steps=1)
    whatif = next(w for w in plan.whatifs if w.name == "activation-checkpointing")
    assert whatif.applicable, whatif.note
    assert "use_cache off" in whatif.method
    assert whatif.delta_allocated_bytes < 0


def test_a_whatif_that_cannot_run_is_said_in_one_line_by_the_audit(capsys, monkeypatch):
    import levers.memory.whatif as whatif
    from levers.cli import main

    def broken(workload):
        raise RuntimeError("Attempting to broadcast a dimension of length 1024")

    monkeypatch.setattr(whatif, "checkpoint_blocks", broken)
    code = main(["audit", "demo", "--warmup", "0", "--timed", "1", "--no-benchmark"])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if "activation-checkpointing what-if" in line]
    assert lines == [
        "warning: levers memory could not predict the activation-checkpointing what-if "
        "(Attempting to broadcast a dimension of length 1024); MEM001 estimates its headroom "
        "from the capture"
    ]


def test_checkpointing_a_model_whose_blocks_take_a_cache_argument_is_predicted_as_ac_full_runs():
    """XLM's attention blocks take a ``cache`` argument its config does not switch off: the
    what-if wraps the blocks as the lever ``ac-full`` does (the cache arguments dropped for each
    call), and predicts the peak the lever's own prediction gives. Wrapped by hand, the recompute
    appended to the cache a second time and the what-if failed ("expanded size ... (64) must
    match ... (32)")."""
    params = {"model": "xlm", "task": "masked-lm"}
    plan = predict_memory("arch", "h100-80gb", params=params, whatifs=True, num_steps=1)
    whatif = next(w for w in plan.whatifs if w.name == "activation-checkpointing")
    assert whatif.applicable, whatif.note
    with_lever = predict_memory("arch", "h100-80gb", params=params, num_steps=1,
                                transform=lambda workload: levers.apply(workload, ["ac-full"]))
    assert whatif.peak_allocated_bytes == with_lever.peak_allocated_bytes
