"""The search's logic, on a fake A/B: which levers are kept, dropped, and why; the budget."""

from __future__ import annotations

from fakes import Clock, FakeAb, ordered

from levers.tune.search import OUT_OF_BUDGET, search


def _run(fake: FakeAb, ids, budget_s: float = 1000.0):
    return search(ordered(*ids), fake, budget_s=budget_s, clock=fake.clock)


def _reason(result, lever: str) -> str:
    return next(o.reason for o in result.outcomes if o.lever == lever)


def test_a_lever_that_pays_is_kept_and_proven_against_the_baseline():
    fake = FakeAb({"fast": 1.3})
    result = _run(fake, ["fast"])
    assert result.stack == ("fast",)
    assert result.proof is not None and result.proof.base == () and result.proof.stack == ("fast",)
    assert [o.kept for o in result.outcomes] == [True]


def test_a_lever_that_fails_parity_is_dropped_with_the_gate_s_words():
    fake = FakeAb({"fast": 1.3, "wrong": 1.5}, damaged=frozenset({"wrong"}))
    result = _run(fake, ["wrong", "fast"])
    assert result.stack == ("fast",)
    assert _reason(result, "wrong").startswith("failed parity (loss after step 2")


def test_a_lever_that_slows_the_step_is_dropped():
    fake = FakeAb({"slow": 0.8, "fast": 1.2})
    result = _run(fake, ["slow", "fast"])
    assert result.stack == ("fast",)
    assert _reason(result, "slow").startswith("slower: tokens/s 0.800x")


def test_a_lever_whose_ci_holds_one_does_not_pay():
    fake = FakeAb({"same": 1.005})
    result = _run(fake, ["same"])
    assert result.stack == () and result.proof is None
    assert "holds 1" in _reason(result, "same")


def test_a_lever_that_cannot_be_built_on_the_stack_is_dropped_with_why():
    fake = FakeAb({"fast": 1.2, "odd": 1.5}, broken={"odd": "lever odd does not apply: no blocks"})
    result = _run(fake, ["fast", "odd"])
    assert result.stack == ("fast",)
    assert _reason(result, "odd") == "lever odd does not apply: no blocks"


def test_increments_are_measured_on_top_of_the_stack_and_the_stack_is_proven_at_the_end():
    fake = FakeAb({"a": 1.2, "b": 1.1})
    result = _run(fake, ["a", "b"])
    assert result.stack == ("a", "b")
    assert fake.calls == [((), ("a",)), (("a",), ("a", "b")), ((), ("a", "b"))]
    assert result.proof.base == () and result.proof.stack == ("a", "b")
    assert abs(result.proof.tokens_per_s_ratio - 1.32) < 1e-9


def test_a_stack_not_proven_against_the_baseline_falls_back_to_the_largest_proven_one():
    # each increment pays, but the two together are slower than the first alone
    fake = FakeAb({"a": 1.2, "b": 1.1}, together={("a", "b"): 0.95})
    result = _run(fake, ["a", "b"])
    assert result.stack == ("a",)
    assert result.proof.stack == ("a",) and result.proof.tokens_per_s_ratio > 1.0
    assert "not proven against the baseline" in _reason(result, "b")
    assert "the largest stack proven, a" in result.notes[0]


def test_the_answer_is_never_slower_than_the_baseline():
    for speeds in ({"a": 0.7}, {"a": 1.0}, {"a": 1.3, "b": 0.5}, {"a": 0.9, "b": 0.99}):
        result = _run(FakeAb(speeds), list(speeds))
        if result.stack:
            assert result.proof.base == () and result.proof.tokens_per_s_ci95[0] > 1.0
        else:
            assert result.proof is None


def test_exclusive_levers_are_tried_as_alternatives_and_the_faster_one_kept():
    fake = FakeAb({"compile-blocks": 1.25, "compile-model": 1.6, "x": 1.1})
    result = _run(fake, ["compile-blocks", "x", "compile-model"])
    assert result.stack == ("compile-model", "x")
    # both compile forms were measured against the same (empty) stack
    assert ((), ("compile-blocks",)) in fake.calls and ((), ("compile-model",)) in fake.calls
    assert "its alternative compile-model paid more" in _reason(result, "compile-blocks")


def test_a_lever_that_clashes_with_a_kept_one_is_not_tried():
    fake = FakeAb({"ac-full": 1.1, "ac-selective": 1.05})
    result = search(ordered("ac-full", "ac-selective"), fake, budget_s=1e3, clock=fake.clock)
    # both are one group: tried side by side, the faster kept
    assert result.stack == ("ac-full",)
    assert "its alternative ac-full paid more" in _reason(result, "ac-selective")


def test_the_budget_stops_the_search_with_the_best_proven_stack():
    fake = FakeAb({"a": 1.2, "b": 1.1, "c": 1.1, "d": 1.1}, cost_s=10.0)
    result = _run(fake, ["a", "b", "c", "d"], budget_s=45.0)
    # a (10 s); b and c each need one A/B plus the final proof (20 s), with 35 s and 25 s left;
    # d would need 20 s of the 15 s left: the search stops there and proves a,b,c in them
    assert result.out_of_budget
    assert result.stack == ("a", "b", "c") and result.proof.stack == ("a", "b", "c")
    assert _reason(result, "d") == OUT_OF_BUDGET
    assert fake.calls[-1] == ((), ("a", "b", "c"))
    assert result.spent_s <= 45.0


def test_a_budget_too_small_for_one_more_a_b_returns_nothing_slower():
    fake = FakeAb({"a": 1.2}, cost_s=10.0)
    result = _run(fake, ["a", "b"], budget_s=5.0)
    # the first A/B runs (nothing says how long it takes), overruns, and the search stops
    assert len(fake.calls) == 1 and result.out_of_budget
    assert _reason(result, "b") == OUT_OF_BUDGET


def test_a_trial_killed_by_the_budget_stops_the_search():
    from dataclasses import replace

    fake = FakeAb({"a": 1.2, "b": 1.2})

    def killed(base, stack, left_s):
        trial = fake(base, stack, left_s)
        return replace(trial, killed="the time budget ran out", killed_kind="time_budget")

    result = search(ordered("a", "b"), killed, budget_s=1e3, clock=fake.clock)
    assert result.stack == () and result.out_of_budget
    assert _reason(result, "a").startswith("the A/B was stopped")
    assert _reason(result, "b") == OUT_OF_BUDGET


def test_nothing_pays_is_an_answer_with_every_reason():
    fake = FakeAb({"a": 0.9, "b": 1.0})
    result = _run(fake, ["a", "b"])
    assert result.stack == () and result.proof is None
    assert [o.lever for o in result.outcomes] == ["a", "b"]
    assert all(o.reason for o in result.outcomes)


def test_an_alternative_of_the_first_group_needs_no_time_for_a_final_proof():
    # 25 s: the first compile form (10 s), then its rival needs one A/B (10 s) and no proof
    fake = FakeAb({"compile-blocks": 1.2, "compile-model": 1.4}, cost_s=10.0)
    result = _run(fake, ["compile-blocks", "compile-model"], budget_s=25.0)
    assert result.stack == ("compile-model",) and len(fake.calls) == 2


def test_a_lever_that_a_kept_one_covers_is_not_tried():
    fake = FakeAb({"compile-blocks": 1.3, "rms-norm-fused": 1.1})
    result = _run(fake, ["compile-blocks", "rms-norm-fused"])
    assert result.stack == ("compile-blocks",) and len(fake.calls) == 1
    assert "compile-blocks, which was kept, already does what it does" in _reason(
        result, "rms-norm-fused"
    )
