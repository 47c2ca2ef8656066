"""tune's real A/B (levers.tune.measure.ab_measure): one float64 run per search, phases timed."""

from __future__ import annotations

import levers.ab.parity as parity_mod
from levers.tune.measure import TrialDesign, ab_measure

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
