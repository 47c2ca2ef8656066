"""Every lever's contract on a fixed sample of eleven architectures beyond the zoo, with the code
of ``bench/arch_sweep.py`` (the sweep over all of them is committed in
``bench/results/arch_sweep_cpu``): ``applies`` says why not or the lever applies; where it
applies, the parity gate of ``levers ab`` holds (PARITY) and the undo puts the model back so
that it computes bitwise as a never-patched one.

The ten span the families: learned positions (opt), ALiBi (bloom), parallel residual
(gpt_neox), local and global attention (gpt_neo), a state-space model (mamba), a mixture of
experts (olmoe), an encoder masked LM with relative attention (deberta-v2), an encoder-decoder
(bart), a vision transformer (deit) and a pyramid of convolutional patch embeddings and
spatial-reduction attention (pvt_v2); a vision-language model whose config nests a text and a
vision config (gemma3, on text-only batches); two timm models where timm is installed.

Three levers are left to the sweep, to keep this module at a few minutes on two cores: the
optimizer-state levers (adamw-8bit, adamw-bf16-state) replace the optimizer's update whatever
the architecture (tests/levers/test_optimizer_state.py checks their contract) and torchao
compiles that update with inductor, minutes of C++ on a CPU; ac-budget predicts the step's
memory on fake tensors, ~10 s an architecture (tests/levers/test_ac_budget*.py).
"""

from __future__ import annotations

import pytest
import torch
from bench_module import bench_module

pytest.importorskip("transformers")

from levers.levers import load_all  # noqa: E402
from levers.workloads import arch  # noqa: E402


ARCHITECTURES = [
    "opt", "bloom", "gpt_neox", "gpt_neo", "mamba", "olmoe", "deberta-v2/masked-lm",
    "bart/seq2seq", "deit", "pvt_v2", "gemma3",
]
TIMM = ["timm:resnet18", "timm:vit_tiny_patch16_224"]
# left to the sweep: see the module docstring
SWEEP_ONLY = ("adamw-8bit", "adamw-bf16-state", "ac-budget")
LEVERS = sorted(
    i for i, lever in load_all().items()
    if lever.choose_params is None and i not in SWEEP_ONLY
)


def _sweep():
    return bench_module("arch_sweep.py", "bench_arch_sweep")


sweep = _sweep()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Two intra-op threads on a loaded 2-core CPU spin against each other (a tiny step took
    3 s with two, 40 ms with one); the sweep's workers run with one as well."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def contract_rows(name: str) -> dict[str, dict]:
    model, task = sweep.split_arch(name)
    build = sweep.builder(model, arch.resolve_task(model, task))
    cached = []

    def reference():
        if not cached:
            cached.append(sweep.reference_for(lambda: sweep.seeded(build), num_steps=2,
                                              exactness="changes-numerics", seed=0)[0])
        return cached[0]

    registry = load_all()
    return {
        lever_id: sweep.contract(build, registry[lever_id], sweep.CPU_OPTIONS.get(lever_id, {}),
                                 reference=reference, parity_steps=2)
        for lever_id in LEVERS
    }


def assert_contract(name: str, rows: dict[str, dict]) -> None:
    applied = []
    for lever_id, row in rows.items():
        if row["parity"] is None and row["error"] is None:
            assert isinstance(row["applies"], str) and len(row["applies"]) > 10, (lever_id, row)
            continue
        applied.append(lever_id)
        assert row["applies"] is None, (lever_id, row)
        assert row["error"] is None, (name, lever_id, row["error"])
        assert row["parity"]["verdict"] == "PARITY", (name, lever_id, row["parity"]["note"])
        assert row["undo_ok"] is True, (name, lever_id, row["undo_problems"])
    # the test cannot pass by applying nothing
    assert {"ac-full", "compile-blocks", "compile-model", "windowed-peak-metric"} <= set(applied)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_every_lever_keeps_its_contract_beyond_the_zoo(name):
    assert_contract(name, contract_rows(name))


@pytest.mark.parametrize("name", TIMM)
def test_every_lever_keeps_its_contract_on_timm(name):
    assert_contract(name, contract_rows(name))


def test_the_undo_check_catches_a_lever_that_leaves_a_change_behind():
    """A lever whose undo forgets to put back a module's forward: the check says where."""
    from levers.levers.lever import Lever

    def patch(target):
        block = target.model.model.decoder.layers[0]
        original = block.forward
        block.forward = lambda *args, **kwargs: original(*args, **kwargs)
        return lambda: None  # forgets it

    leaky = Lever(id="leaky", title="t", safety="exact", fixes=(), applies=lambda t: None,
                  patch=patch)
    from levers.levers import REGISTRY

    REGISTRY["leaky"] = leaky
    try:
        row = sweep.contract(sweep.builder("opt", "causal-lm"), leaky, {},
                             reference=lambda: None, parity_steps=1)
    finally:
        del REGISTRY["leaky"]
    assert row["parity"]["verdict"] == "PARITY" and row["undo_ok"] is False
    assert any("attributes differ: model.decoder.layers.0" in p for p in row["undo_problems"])


def test_a_lever_that_changes_the_math_is_damaged():
    from levers.levers import REGISTRY
    from levers.levers.lever import Lever

    def patch(target):
        model = target.model
        original = model.forward

        def scaled(*args, **kwargs):
            out = original(*args, **kwargs)
            out.loss = out.loss * 1.01
            return out

        model.forward = scaled
        return lambda: vars(model).pop("forward")

    wrong = Lever(id="wrong", title="t", safety="changes-numerics", tolerance=1e-5, fixes=(),
                  applies=lambda t: None, patch=patch)
    REGISTRY["wrong"] = wrong
    try:
        build = sweep.builder("opt", "causal-lm")

        def reference():
            return sweep.reference_for(lambda: sweep.seeded(build), num_steps=1,
                                       exactness="changes-numerics", seed=0)[0]

        row = sweep.contract(build, wrong, {}, parity_steps=1, reference=reference)
    finally:
        del REGISTRY["wrong"]
    assert row["parity"]["verdict"] == "DAMAGED" and row["undo_ok"] is True
    assert "loss after step 1 differs from the float64 run" in row["parity"]["note"]
