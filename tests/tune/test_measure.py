"""tune's real A/B (levers.tune.measure.ab_measure): one float64 run per search, phases timed,
a compiled stack compiled once."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

import levers.ab.parity as parity_mod
from levers.ab.verdict import PARITY
from levers.tune.measure import TrialDesign, ab_measure
from levers.tune.render import EAGER_RANDOM_WORDS, proof_lines

DESIGN = TrialDesign(steps=2, warmup=1, parity_steps=2, resamples=200)


def test_the_float64_run_is_made_once_per_search(monkeypatch):
    made = []
    real = parity_mod.run_reference

    def counted(build, **kwargs):
        made.append(kwargs)
        return real(build, **kwargs)

    monkeypatch.setattr(parity_mod, "run_reference", counted)
    measure = ab_measure("demo", {"size": "tiny"}, DESIGN)
    # numerics-changing levers: held to the float64 run (an exact one is held to the baseline)
    first = measure((), ("loss-valid-rows",), None)
    second = measure(("loss-valid-rows",), ("loss-valid-rows", "rms-norm-fused"), None)
    assert len(made) == 1
    assert first.error is None and second.error is None, (first.error, second.error)
    # both judged by the same float64 run (the demo is built in fp32 and has one)
    for trial in (first, second):
        assert trial.ab.parity.rule != "tolerance", trial.ab.parity.tolerance_reason
        assert trial.ab.parity.reference_losses == first.ab.parity.reference_losses
    # the first trial made it and says how long it took; the second did not
    assert "reference" in first.phase_s and "reference" not in second.phase_s
    assert {"build", "parity", "warmup", "timed"} <= set(second.phase_s)
    assert abs(sum(first.phase_s.values()) - first.wall_s) < 0.5 * first.wall_s


def test_a_search_with_its_own_measure_makes_its_own_float64_run(monkeypatch):
    made = []
    real = parity_mod.run_reference
    monkeypatch.setattr(
        parity_mod, "run_reference", lambda build, **kw: made.append(1) or real(build, **kw)
    )
    for _ in range(2):
        ab_measure("demo", {"size": "tiny"}, DESIGN)((), ("inplace-scatter",), None)
    assert len(made) == 2


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="inductor on the CPU needs a C++ compiler",
)
@pytest.mark.parametrize("p", [0.1, 0.0])
def test_a_compiled_trial_is_timed_on_its_parity_programs_and_says_so(p):
    # one compile per compiled stack, not two, where the model draws random numbers; the proof
    # says its timed steps drew them as eager does
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    spec = f"{Path(__file__).parent / 'dropout_factory.py'}:build"
    trial = ab_measure(spec, {"p": p}, DESIGN)((), ("compile-model",), None)
    assert trial.error is None and trial.parity == PARITY, (trial.error, trial.parity_note)
    assert trial.timed_eager_random is (p > 0)
    assert counters["stats"]["unique_graphs"] - before == 1
    assert (EAGER_RANDOM_WORDS in proof_lines(trial)) is (p > 0)


def test_a_trial_compiled_without_inductor_draws_as_eager_and_claims_nothing_else():
    # compile-model's CUDA-graph form replays eager's kernels: whatever fallback_random said
    # while its parity steps compiled, its timed steps draw random numbers as the user's run
    # does; aot_eager is that backend on a CPU
    import torch._inductor.config  # noqa: F401 - ab turns fallback_random on where it is loaded

    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    spec = f"{Path(__file__).parent / 'dropout_factory.py'}:build"
    trial = ab_measure(spec, {"p": 0.1}, DESIGN)((), ("compile-model:backend=aot_eager",), None)
    assert trial.error is None and trial.parity == PARITY, (trial.error, trial.parity_note)
    assert counters["stats"]["unique_graphs"] - before == 1  # compiled while drawn alike
    assert trial.ab.timed_eager_random is True  # ab counts the program, whatever its backend
    assert trial.timed_eager_random is False
    assert EAGER_RANDOM_WORDS not in proof_lines(trial)


def test_only_a_stack_whose_compile_levers_all_skip_inductor_compiles_without_it():
    from levers.tune.trial import compiles_without_inductor

    assert compiles_without_inductor(("compile-model:backend=cudagraphs", "channels-last"))
    assert not compiles_without_inductor(("compile-model",))
    assert not compiles_without_inductor(("compile-blocks", "compile-model:backend=cudagraphs"))
    assert not compiles_without_inductor(("channels-last",))  # nothing compiled by the stack


@pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="inductor on the CPU needs a C++ compiler",
)
def test_as_run_the_trial_compiles_again_for_its_timed_steps():
    # the search's last A/B where the proof drew random numbers as eager does
    torch._dynamo.reset()
    before = counters["stats"]["unique_graphs"]
    spec = f"{Path(__file__).parent / 'dropout_factory.py'}:build"
    trial = ab_measure(spec, {"p": 0.1}, DESIGN)((), ("compile-model",), None, as_run=True)
    assert trial.error is None and trial.parity == PARITY, (trial.error, trial.parity_note)
    assert trial.timed_eager_random is False
    assert counters["stats"]["unique_graphs"] - before == 2
    assert EAGER_RANDOM_WORDS not in proof_lines(trial)


def test_tune_s_a_b_s_stop_once_decided_and_say_how_many_steps_they_timed(monkeypatch):
    import levers.ab.runner as runner_mod
    import levers.tune.measure as measure_mod

    seen = []

    def run_ab(baseline, candidate, config, reference=None):
        seen.append(config)
        return runner_mod.run_ab(baseline, candidate, config, reference)

    monkeypatch.setattr(measure_mod, "run_ab", run_ab)
    trial = ab_measure("demo", {"size": "tiny"}, DESIGN)((), ("inplace-scatter",), None)
    assert trial.error is None
    assert [c.stop_when_decided for c in seen] == [True]
    # two steps asked for have no look (levers.ab.looks): both timed
    assert trial.num_steps == trial.timed_steps == 2
