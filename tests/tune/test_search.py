"""The search's logic, on a fake A/B: which levers are kept, dropped, and why; the budget."""

from __future__ import annotations

from fakes import Clock, FakeAb, ordered

from levers.tune.candidates import Candidate
from levers.tune.search import OUT_OF_BUDGET, UNCONFIRMED, search
from levers.tune.trial import AS_RUN, CONFIRMATION, SELECTION


def _run(fake: FakeAb, ids, budget_s: float = 1000.0):
    return search(ordered(*ids), fake, budget_s=budget_s, clock=fake.clock)


def _reason(result, lever: str) -> str:
    return next(o.reason for o in result.outcomes if o.lever == lever)


def test_a_lever_that_pays_is_kept_and_proven_by_a_fresh_a_b_not_the_one_that_selected_it():
    fake = FakeAb({"fast": 1.3})
    result = _run(fake, ["fast"])
    assert result.stack == ("fast",)
    assert fake.calls == [((), ("fast",)), ((), ("fast",))]
    assert result.confirmed_by == 1 and result.proof is result.trials[1]
    assert [t.role for t in result.trials] == [SELECTION, CONFIRMATION]
    assert result.proof.base == () and result.proof.stack == ("fast",)
    [outcome] = result.outcomes
    assert outcome.kept and (outcome.trial, outcome.confirmed_by) == (0, 1)
    assert "confirmed by a fresh A/B (A/B 2): tokens/s 1.300x" in outcome.reason


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
    # each increment selected, then confirmed afresh; the stack proven against the baseline
    assert fake.calls == [((), ("a",)), ((), ("a",)), (("a",), ("a", "b")), (("a",), ("a", "b")),
                          ((), ("a", "b"))]
    assert result.confirmed_by == 4
    assert result.proof.base == () and result.proof.stack == ("a", "b")
    assert abs(result.proof.tokens_per_s_ratio - 1.32) < 1e-9


def test_a_stack_not_proven_against_the_baseline_falls_back_to_the_largest_proven_one():
    # each increment pays, but the two together are slower than the first alone
    fake = FakeAb({"a": 1.2, "b": 1.1}, together={("a", "b"): 0.95})
    result = _run(fake, ["a", "b"])
    assert result.stack == ("a",) and result.selected == ("a", "b")
    # a's proof is its confirmation, a fresh A/B against the baseline
    assert result.proof is result.trials[1] and result.proof.role == CONFIRMATION
    assert result.proof.stack == ("a",) and result.proof.tokens_per_s_ratio > 1.0
    assert "no stack with it was proven against the baseline" in _reason(result, "b")
    assert "the answer is a, which its confirmation proved" in result.notes[0]


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
    result = _run(fake, ["a", "b", "c", "d"], budget_s=75.0)
    # a and its confirmation (20 s); b needs its A/B, its confirmation and the final proof
    # (30 s) of the 55 s left; c would need 30 s of the 35 s left, then d 30 s of the 15 s
    # left: the search stops there and proves a,b,c in them
    assert result.out_of_budget
    assert result.stack == ("a", "b", "c") and result.proof.stack == ("a", "b", "c")
    assert _reason(result, "d") == OUT_OF_BUDGET
    assert fake.calls[-1] == ((), ("a", "b", "c"))
    assert result.spent_s <= 75.0


def test_a_lever_passed_over_for_time_does_not_end_the_search_once_a_b_s_get_cheap():
    # the first compile's cold A/B takes 100 s of 180; its rival would need as long again
    # and is passed over; the confirmation finds the programs cached (7 s), so the median
    # A/B (53.5 s) and two more confirmations (7 s each) fit the 73 s left: c is tried on top
    fake = FakeAb({"compile-model": 1.4, "compile-blocks": 1.2, "c": 1.1},
                  costs_s=(100.0,), cost_s=7.0)
    result = _run(fake, ["compile-model", "compile-blocks", "c"], budget_s=180.0)
    assert _reason(result, "compile-blocks") == OUT_OF_BUDGET and result.out_of_budget
    assert result.stack == ("compile-model", "c")
    assert fake.calls == [((), ("compile-model",)), ((), ("compile-model",)),
                          (("compile-model",), ("compile-model", "c")),
                          (("compile-model",), ("compile-model", "c")),
                          ((), ("compile-model", "c"))]
    assert result.spent_s <= 180.0


def test_a_budget_too_small_for_one_more_a_b_returns_nothing_slower():
    fake = FakeAb({"a": 1.2}, cost_s=10.0)
    result = _run(fake, ["a", "b"], budget_s=5.0)
    # the first A/B runs (nothing says how long it takes), overruns, and the search stops:
    # a paid once, but no time is left for the fresh A/B that would confirm it
    assert len(fake.calls) == 1 and result.out_of_budget
    assert result.stack == () and result.proof is None
    assert _reason(result, "a").endswith("but no time was left to confirm it by a fresh A/B "
                                         f"({UNCONFIRMED})")
    assert _reason(result, "b") == OUT_OF_BUDGET
    assert result.unconfirmed == ("a",)


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


def test_an_alternative_of_the_first_group_needs_time_for_its_confirmation_not_a_final_proof():
    # 35 s: the first compile form (10 s), then its rival needs one A/B and the confirmation
    # of the faster (20 s), no proof of a stack of two
    fake = FakeAb({"compile-blocks": 1.2, "compile-model": 1.4}, cost_s=10.0)
    result = _run(fake, ["compile-blocks", "compile-model"], budget_s=35.0)
    assert result.stack == ("compile-model",) and len(fake.calls) == 3
    assert fake.calls[-1] == ((), ("compile-model",))
    # with 25 s, the rival is not tried: the time left keeps the first form's confirmation
    fake = FakeAb({"compile-blocks": 1.2, "compile-model": 1.4}, cost_s=10.0)
    result = _run(fake, ["compile-blocks", "compile-model"], budget_s=25.0)
    assert result.stack == ("compile-blocks",) and len(fake.calls) == 2
    assert _reason(result, "compile-model") == OUT_OF_BUDGET


T5_FORMS = ["compile-model", "compile-blocks", "compile-model:mode=default"]


def _t5_like(**kw) -> FakeAb:
    # as on T5 at 3dad68e (H100): the first whole-model compile pays 2.96x in 76.5 s, of which
    # 72.5 s compile; per-block compile pays 1.80x in 40.2 s (36.2 s compile); the third form
    # compiles the whole model again, 70 s; a confirmation, its programs cached, takes 12 s
    return FakeAb({"compile-model": 2.96, "compile-blocks": 1.80,
                   "compile-model:mode=default": 2.5},
                  cold_s={("compile-model",): (76.5, 72.5), ("compile-blocks",): (40.2, 36.2),
                          ("compile-model:mode=default",): (70.0, 66.0)},
                  cost_s=12.0, **kw)


def test_an_alternative_is_not_tried_into_the_time_that_confirms_the_one_that_paid():
    # 63.3 s were left after two forms; the third's A/B (58 s by the median) and the 8 s that
    # a confirmation was estimated to take fitted, and it was given them all: it ran out, and
    # the 2.96x that had paid went unconfirmed. The reserve for that confirmation is the
    # estimate and a tenth of the compiling of the selection that paid (8 + 7.25 s): the third
    # form is passed over, and the first is confirmed (12 s) and kept
    fake = _t5_like(kills=True)
    result = _run(fake, T5_FORMS, budget_s=180.0)
    assert result.stack == ("compile-model",)
    assert fake.calls == [((), ("compile-model",)), ((), ("compile-blocks",)),
                          ((), ("compile-model",))]
    assert _reason(result, "compile-model:mode=default") == OUT_OF_BUDGET


def test_an_alternative_tried_beside_a_paid_one_is_stopped_where_its_confirmation_starts():
    # with 40 s more, the third form is tried (its estimate is the 76.5 s the form that paid
    # took, not the median), but its compile is slower than that one's (95 s) and its kill line
    # keeps the confirmation's reserve (15.25 s): it is stopped there, and the first form is
    # confirmed in the time kept
    fake = _t5_like(kills=True)
    fake.cold_s[("compile-model:mode=default",)] = (95.0, 91.0)
    result = _run(fake, T5_FORMS, budget_s=220.0)
    assert result.stack == ("compile-model",) and len(fake.calls) == 4
    assert fake.calls[-1] == ((), ("compile-model",))
    assert result.trials[2].out_of_time
    assert "its kill line kept 15s for the confirmation of compile-model, which paid" in _reason(
        result, "compile-model:mode=default")


def test_an_alternative_is_expected_to_take_as_long_as_the_form_of_its_group_that_paid():
    # with 20 s more than above the median of the group's selections (58 s) and the reserve
    # would fit, but the form that paid took 76.5 s, and the third compiles the whole model as
    # it did: it is passed over, and its time goes to the confirmation
    fake = _t5_like(kills=True)
    result = _run(fake, T5_FORMS, budget_s=200.0)
    assert result.stack == ("compile-model",)
    assert fake.calls == [((), ("compile-model",)), ((), ("compile-blocks",)),
                          ((), ("compile-model",))]
    assert _reason(result, "compile-model:mode=default") == OUT_OF_BUDGET


def test_a_form_of_a_group_that_paid_is_not_tried_into_the_proof_s_time():
    # as ministral3 on an H100 (s51): float8 paid on top of the compile form after a 42-s
    # selection; float8-rowwise, estimated at the median selection (here 33 s), was tried and
    # stopped at its kill line (25 s kept: float8's confirmation took 22 s, not 11), and the
    # stack's proof had 1.6 s: the answer fell back to the compile form alone, where the best
    # peer was float8. Estimated as long as float8's selection, float8-rowwise is passed over
    fake = FakeAb({"compile": 1.36, "float8": 1.10, "float8-rowwise": 1.05},
                  cold_s={("compile",): (24.0, 15.0), ("compile", "float8"): (42.0, 34.0),
                          ("compile", "float8-rowwise"): (40.0, 32.0)},
                  costs_s=(0.0, 11.0, 0.0, 0.0, 22.0, 11.0), cost_s=11.0, kills=True)
    result = _run(fake, ["compile", "float8", "float8-rowwise"], budget_s=138.0)
    assert result.stack == ("compile", "float8")
    assert _reason(result, "float8-rowwise") == OUT_OF_BUDGET
    assert result.proof is result.trials[-1] and result.proof.stack == ("compile", "float8")


GRAPHS = "compile-model:backend=cudagraphs"
COMPILE_FORMS = [*T5_FORMS, GRAPHS]


def _inception_like(**kw) -> FakeAb:
    # as timm's inception_resnet_v2 on an H200 at e029f3b: inductor's first compile takes
    # ~205 s (more than a 3-minute budget), reduce-overhead compile then runs 3.10x; the step's
    # CUDA graphs without inductor trace in ~20 s; a confirmation takes 15 s
    return FakeAb({"compile-model": 3.1, "compile-blocks": 0.7, "compile-model:mode=default": 0.97,
                   GRAPHS: 2.6},
                  cold_s={("compile-model",): (205.0, 200.0), ("compile-blocks",): (60.0, 55.0),
                          ("compile-model:mode=default",): (205.0, 200.0), (GRAPHS,): (25.0, 20.0)},
                  cost_s=15.0, kills=True, **kw)


def test_a_compile_longer_than_the_budget_is_stopped_where_the_fallback_s_time_starts():
    # inductor's compile would take the whole budget and more (the H200 row kept nothing where
    # the best peer ran 3.10x): its kill line keeps 45% of the time for the CUDA-graph form,
    # which is tried and confirmed in it
    fake = _inception_like()
    result = _run(fake, COMPILE_FORMS, budget_s=180.0)
    assert result.stack == (GRAPHS,)
    assert fake.calls == [((), ("compile-model",)), ((), (GRAPHS,)), ((), (GRAPHS,))]
    assert result.trials[0].out_of_time and result.trials[0].wall_s == 99.0
    assert f"its kill line kept 1m21s for {GRAPHS}" in _reason(result, "compile-model")
    assert _reason(result, "compile-blocks") == OUT_OF_BUDGET
    assert result.spent_s <= 180.0
    assert result.notes == ("compile-model did not finish in the 1m39s it was given (a first "
                            "step compiles the model); a --budget of 6m00s or more gives it "
                            "longer",)


BLOCKS_GRAPHS = "compile-blocks:mode=reduce-overhead"


def _inception_with_blocks_graphs(speed: float) -> FakeAb:
    # the blocks' programs under CUDA graphs as a fallback beside the step's own graphs: a
    # 30-s first A/B, of which 27 s compile (inception_resnet_v2, H100, s65)
    fake = _inception_like()
    fake.speed[BLOCKS_GRAPHS] = speed
    fake.cold_s[(BLOCKS_GRAPHS,)] = (30.0, 27.0)
    return fake


def test_the_fallbacks_are_tried_in_order_and_the_second_not_once_the_first_paid():
    # as inception_resnet_v2 on an H100 (s65): the blocks' programs under CUDA graphs compile in
    # ~27 s and run 1.87x, where the step's own kernels as graphs ran 1.17x (s64). The two share
    # the time the other forms' kill line keeps; the first is tried first, pays and is
    # confirmed, and the second is then only a fallback of a form that paid
    fake = _inception_with_blocks_graphs(1.87)
    result = _run(fake, [*T5_FORMS, BLOCKS_GRAPHS, GRAPHS], budget_s=180.0)
    assert result.stack == (BLOCKS_GRAPHS,)
    assert fake.calls == [((), ("compile-model",)), ((), (BLOCKS_GRAPHS,)),
                          ((), (BLOCKS_GRAPHS,))]
    assert (f"its kill line kept 1m21s for {BLOCKS_GRAPHS} and {GRAPHS}, tried where no form "
            "of the group pays") in _reason(result, "compile-model")
    assert _reason(result, GRAPHS) == (
        f"not tried: {BLOCKS_GRAPHS} paid, and this form is only a fallback where no other "
        "form pays in the time")
    assert result.spent_s <= 180.0


def test_the_time_kept_for_the_fallbacks_holds_the_first_one_s_confirmation():
    # inception_resnet_v2 through tune at 3m on an H100 (s66, f783213): the blocks under CUDA
    # graphs were selected in 34.4 s (1.864x), and their confirmation, a fresh build compiled
    # again, was stopped at 37.6 s inside its first step: 72 s had been kept for the two A/Bs,
    # and nothing was kept. The time kept now holds a confirmation as long as that compile
    fake = _inception_with_blocks_graphs(1.864)
    fake.cold_s[(BLOCKS_GRAPHS,)] = (34.4, 26.7)
    fake.costs_s = (0.0, 0.0, 40.0)  # the confirmation (third A/B) compiles again
    result = _run(fake, [*T5_FORMS, BLOCKS_GRAPHS, GRAPHS], budget_s=180.0)
    assert fake.calls == [((), ("compile-model",)), ((), (BLOCKS_GRAPHS,)),
                          ((), (BLOCKS_GRAPHS,))]
    assert result.stack == (BLOCKS_GRAPHS,) and not result.trials[-1].out_of_time
    assert result.spent_s <= 180.0


def test_where_the_first_fallback_does_not_pay_the_second_is_tried():
    fake = _inception_with_blocks_graphs(0.9)
    result = _run(fake, [*T5_FORMS, BLOCKS_GRAPHS, GRAPHS], budget_s=180.0)
    assert result.stack == (GRAPHS,)
    assert fake.calls == [((), ("compile-model",)), ((), (BLOCKS_GRAPHS,)), ((), (GRAPHS,)),
                          ((), (GRAPHS,))]
    assert not {o.lever: o for o in result.outcomes}[BLOCKS_GRAPHS].kept


OVERWRITTEN = ("RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
               "overwritten by a subsequent run. Stack trace: File \"convit.py\", line 409, in "
               "forward\n    x = self.forward_features(x)\n  File \"convit.py\", line 73")


def _convit_like(**kw) -> FakeAb:
    # as timm's convit_tiny on an H100 (s51): whole-model compile's CUDA graphs fail at its
    # second parity step after 65 s of compiling (a module keeps a graph's output as an
    # attribute); the fallback's graphs fail too; inductor's default mode runs 1.36x
    return FakeAb({"compile-model": 1.35, "compile-blocks": 1.30,
                   "compile-model:mode=default": 1.36},
                  cold_s={("compile-model",): (65.0, 63.0), ("compile-blocks",): (12.0, 4.0),
                          ("compile-model:mode=default",): (24.0, 15.0), (GRAPHS,): (15.0, 14.0)},
                  raises={"compile-model": OVERWRITTEN, GRAPHS: "AssertionError: "},
                  cost_s=11.0, kills=True, **kw)


def test_where_the_cuda_graphs_fail_the_form_without_them_is_tried_next_not_the_fallback():
    # the fallback kept 81 s of the budget and the median A/B was the failed compile's 65 s:
    # neither other form fitted, and the fallback, which records the same graphs, failed too
    # (s51: nothing kept where model.compile() ran 2.1x). Now the graphs' failure gives the
    # fallback's time to inductor's default mode, tried next, which pays and is kept
    fake = _convit_like()
    result = _run(fake, COMPILE_FORMS, budget_s=180.0)
    assert result.stack == ("compile-model:mode=default",)
    assert fake.calls[:2] == [((), ("compile-model",)), ((), ("compile-model:mode=default",))]
    assert all(GRAPHS not in stack for _, stack in fake.calls)
    # the reason is one line: the kill's first line, cut at 160 characters
    assert _reason(result, GRAPHS) == (
        "not tried: compile-model's CUDA graphs failed on this step (candidate parity step 2 "
        "raised RuntimeError: Error: accessing tensor output of CUDAGraphs that has been "
        "overwritten by a subsequent run. Stack trace: File \"conv...), and this form records the "
        "same graphs")
    assert _reason(result, "compile-blocks").startswith("pays: tokens/s 1.300x")


def test_a_failure_that_does_not_name_the_graphs_leaves_the_fallback_its_time():
    fake = _convit_like()
    fake.raises["compile-model"] = "RuntimeError: shapes do not match"
    result = _run(fake, COMPILE_FORMS, budget_s=180.0)
    # as before: the fallback's 81 s are kept, the other forms passed over, the fallback tried
    assert fake.calls[1] == ((), (GRAPHS,))
    assert _reason(result, "compile-model:mode=default") == OUT_OF_BUDGET
    assert "failed on this step" not in _reason(result, GRAPHS)


def test_an_alternative_that_could_not_beat_the_form_that_paid_is_not_tried():
    # the zoo's mixtral on an H100 (s51): whole-model compile paid 1.66x, then Liger's kernels,
    # expected by the audit to save 3% of the step, took 122 s of a 3-minute budget to run
    # 0.57x. Thrice its expected saving (1.08x) could not make it the group's fastest
    ordered = [Candidate("compile-model", None, "peer"),
               Candidate("compile-blocks", None, "peer"),
               Candidate("liger-kernels", 0.027, "audit FUSE002: 1.48 ms estimated")]
    fake = FakeAb({"compile-model": 1.66, "compile-blocks": 1.57, "liger-kernels": 0.57})
    result = search(ordered, fake, budget_s=180.0, clock=fake.clock)
    assert result.stack == ("compile-model",)
    assert all("liger-kernels" not in stack for _, stack in fake.calls)
    assert _reason(result, "liger-kernels") == (
        "not tried: compile-model paid 1.660x where selected, and this alternative, expected to "
        "save 2.7% of the step (audit FUSE002: 1.48 ms estimated), would still be slower at 3 "
        "times that (1.081x): the group keeps its fastest")
    # one whose expected saving could reach it, or that has none, is tried
    for expected in (0.25, None):
        ordered[2] = Candidate("liger-kernels", expected, "x")
        fake = FakeAb({"compile-model": 1.66, "liger-kernels": 0.57})
        search(ordered, fake, budget_s=180.0, clock=fake.clock)
        assert ((), ("liger-kernels",)) in fake.calls


def test_the_fallback_is_not_tried_where_an_inductor_form_paid():
    # T5's first compile (76.5 s) ends before the line that keeps 81 s for the fallback
    fake = _t5_like(kills=True)
    result = _run(fake, [*T5_FORMS, GRAPHS], budget_s=180.0)
    assert result.stack == ("compile-model",) and not result.trials[0].out_of_time
    assert all(GRAPHS not in stack for _, stack in fake.calls)
    assert _reason(result, GRAPHS) == (
        "not tried: compile-model paid, and this form is only a fallback where no other form "
        "pays in the time")


def test_a_lever_that_a_kept_one_covers_is_not_tried():
    fake = FakeAb({"compile-blocks": 1.3, "rms-norm-fused": 1.1})
    result = _run(fake, ["compile-blocks", "rms-norm-fused"])
    assert result.stack == ("compile-blocks",) and len(fake.calls) == 2  # and its confirmation
    assert "compile-blocks, which was kept, already does what it does" in _reason(
        result, "rms-norm-fused"
    )


def test_the_cuda_graph_form_covers_no_fused_kernel():
    # it replays eager's kernels: a fused norm still has work to do on top of it
    fake = FakeAb({GRAPHS: 2.0, "rms-norm-fused": 1.1})
    result = _run(fake, [GRAPHS, "rms-norm-fused"])
    assert result.stack == (GRAPHS, "rms-norm-fused")


def test_a_lever_whose_fresh_a_b_does_not_pay_is_not_kept():
    # a's first A/B paid by noise; the fresh one holds 1: it is not kept, nor proven
    fake = FakeAb({"a": 1.2, "b": 1.1}, again={("a",): 1.0})
    result = _run(fake, ["a", "b"])
    assert result.stack == ("b",) and result.selected == ("b",)
    assert fake.calls[:3] == [((), ("a",)), ((), ("a",)), ((), ("b",))]
    reason = _reason(result, "a")
    assert reason.startswith("pays: tokens/s 1.200x")
    assert "but a fresh A/B (A/B 2) did not confirm it: does not pay: tokens/s 1.000x" in reason


def test_a_lever_that_pays_only_on_top_of_a_stack_is_confirmed_on_top_of_it():
    # b's increment over a is noise: its selection paid, its confirmation over a does not
    fake = FakeAb({"a": 1.2, "b": 1.1}, again={("a", "b"): 1.0})
    result = _run(fake, ["a", "b"])
    assert result.stack == ("a",) and result.proof is result.trials[1]
    assert fake.calls[3] == (("a",), ("a", "b"))
    assert "did not confirm it" in _reason(result, "b")
    assert not any(o.kept for o in result.outcomes if o.lever == "b")


def test_the_confirmation_times_more_steps_where_the_time_left_holds_them():
    # each A/B: 10 s, of which 20 pairs of 10 ms and 9.9 ms steps; 60% of the 990 s left,
    # less the rest of an A/B, holds thousands of pairs: five times the steps at most
    fake = FakeAb({"a": 1.0 / 0.99}, cost_s=10.0)  # 10 ms against 9.9 ms per step
    result = search(ordered("a"), fake, budget_s=1000.0, clock=fake.clock, steps=20)
    assert fake.steps_asked == [None, 20 * 5]  # at most five times as many
    assert result.proof.num_steps == 100
    # little time left beyond the confirmation's own A/B: the selection's steps
    fake = FakeAb({"a": 1.0 / 0.99}, cost_s=10.0)
    search(ordered("a"), fake, budget_s=20.0, clock=fake.clock, steps=20)
    assert fake.steps_asked == [None, 20]
    # 8 levers still to try: the 90 s left are kept for their A/Bs and the proof first
    fake = FakeAb({"a": 1.3}, cost_s=10.0)
    search(ordered("a", *"bcdefghi"), fake, budget_s=100.0, clock=fake.clock, steps=20)
    assert fake.steps_asked[1] == 20
    # a measure that takes no steps is asked none
    fake = FakeAb({"a": 1.3})
    search(ordered("a"), fake, budget_s=1000.0, clock=fake.clock)
    assert fake.steps_asked == [None, None]


def test_a_selection_whose_ci_holds_one_is_timed_again_longer_where_time_allows():
    # zoo vit on the H200 (3m, s36b): compile-blocks read 1.013x [0.961, 1.120] over 20 steps
    # of a 30 ms step whose times jitter, and nothing was kept where block.compile() gave 1.21x.
    # An undecided gain is timed once more with more steps, then confirmed as any other
    fake = FakeAb({"blocks": 1.08}, cost_s=10.0, wide={("blocks",): 0.1})
    result = search(ordered("blocks"), fake, budget_s=1000.0, clock=fake.clock, steps=20)
    assert fake.steps_asked[:2] == [None, 100]  # the selection, then again five times longer
    assert [t.role for t in result.trials] == [SELECTION, SELECTION, CONFIRMATION]
    assert result.stack == ("blocks",)
    outcome = next(o for o in result.outcomes if o.lever == "blocks")
    assert outcome.trial == 1 and outcome.kept
    # a point estimate of no gain is not timed again, nor one that the time left cannot hold
    fake = FakeAb({"same": 1.005}, cost_s=10.0, wide={("same",): 0.1})
    search(ordered("same"), fake, budget_s=1000.0, clock=fake.clock, steps=20)
    assert fake.steps_asked == [None]
    fake = FakeAb({"blocks": 1.08}, cost_s=10.0, wide={("blocks",): 0.1})
    result = search(ordered("blocks"), fake, budget_s=25.0, clock=fake.clock, steps=20)
    assert fake.steps_asked == [None] and result.stack == ()
    # nor is a trial that failed parity, and a measure that takes no steps is asked none
    fake = FakeAb({"blocks": 1.08}, cost_s=10.0, wide={("blocks",): 0.1},
                  damaged=frozenset({"blocks"}))
    search(ordered("blocks"), fake, budget_s=1000.0, clock=fake.clock, steps=20)
    assert fake.steps_asked == [None]
    fake = FakeAb({"blocks": 1.08}, cost_s=10.0, wide={("blocks",): 0.1})
    search(ordered("blocks"), fake, budget_s=1000.0, clock=fake.clock)
    assert fake.steps_asked == [None]


def test_ctrl_c_inside_an_a_b_ends_the_search_with_what_was_proven():
    from dataclasses import replace

    fake = FakeAb({"a": 1.2, "b": 1.1, "c": 1.1})
    seen = []

    def stopped_in_b(base, stack, left_s, *, steps=None):
        trial = fake(base, stack, left_s, steps=steps)
        if stack[-1:] == ("b",):  # ab's runner turns a Ctrl-C in a step into this kill
            return replace(trial, decision="KILLED", killed="interrupted (Ctrl-C) during "
                           "candidate timed step 7", killed_kind="interrupted")
        return trial

    result = search(ordered("a", "b", "c"), stopped_in_b, budget_s=1e3, clock=fake.clock,
                    on_trial=seen.append)
    assert result.interrupted
    assert fake.calls == [((), ("a",)), ((), ("a",)), (("a",), ("a", "b"))]  # nothing after
    assert seen == list(result.trials) and result.trials[-1].killed_kind == "interrupted"
    # a was confirmed against the baseline before the interrupt: it is what was proven
    assert result.stack == ("a",) and result.proof is result.trials[1]
    assert _reason(result, "b") == (
        "the A/B was stopped: interrupted (Ctrl-C) during candidate timed step 7"
    )
    assert _reason(result, "c") == "not tried: the search was interrupted (Ctrl-C)"
    assert "interrupted (Ctrl-C) during A/B 3" in result.notes[-1]


def test_ctrl_c_outside_a_step_is_recorded_as_an_interrupted_trial_and_nothing_unproven_kept():
    fake = FakeAb({"a": 1.2, "b": 1.1})
    seen = []

    def interrupted_confirmation(base, stack, left_s, *, steps=None):
        if len(fake.calls) == 1:  # the second A/B: a's confirmation
            raise KeyboardInterrupt
        return fake(base, stack, left_s, steps=steps)

    result = search(ordered("a", "b"), interrupted_confirmation, budget_s=1e3,
                    clock=fake.clock, on_trial=seen.append)
    assert result.interrupted and result.stack == () and result.proof is None
    assert [t.role for t in result.trials] == [SELECTION, CONFIRMATION]
    stopped = result.trials[-1]
    assert (stopped.stack, stopped.killed_kind, stopped.decision) == (("a",), "interrupted",
                                                                      "KILLED")
    assert seen == list(result.trials)  # the record gets the interrupted trial too
    assert "interrupted (Ctrl-C) during its confirmation" in _reason(result, "a")
    assert not any(o.kept for o in result.outcomes)


def test_a_second_stack_selected_but_interrupted_before_its_proof_is_not_the_answer():
    fake = FakeAb({"a": 1.2, "b": 1.1})

    def interrupted_proof(base, stack, left_s, *, steps=None):
        if len(fake.calls) == 4:  # a, its confirmation, b, its confirmation: then the proof
            raise KeyboardInterrupt
        return fake(base, stack, left_s, steps=steps)

    result = search(ordered("a", "b"), interrupted_proof, budget_s=1e3, clock=fake.clock)
    assert result.interrupted and result.selected == ("a", "b")
    assert result.stack == ("a",)  # proven by its confirmation; a,b never against the baseline
    assert _reason(result, "b").endswith(
        "but the search was interrupted (Ctrl-C) before a stack with it was proven against the "
        "baseline"
    )


def test_one_cold_compile_does_not_stop_the_search_of_the_cheaper_levers_after_it():
    # the first A/B pays inductor's cold compile (60 s); the rest take 10 s. Judged by the longest
    # A/B, the search stopped after three; by the median it tries every lever (issue 33)
    from fakes import Clock, FakeAb, ordered
    from levers.tune.search import search

    fake = FakeAb({"compile": 1.5, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}, clock=Clock())
    cost = iter([60.0] + [10.0] * 20)

    def measure(base, stack, time_budget_s, **kw):
        fake.cost_s = next(cost)
        return fake(base, stack, time_budget_s, **kw)

    result = search(ordered("compile", "b", "c", "d", "e"), measure, budget_s=200,
                    clock=fake.clock)
    tried = {stack[-1] for _, stack in fake.calls}
    assert tried == {"compile", "b", "c", "d", "e"}
    assert result.stack == ("compile",)


def test_a_compile_selection_s_cost_does_not_stand_for_its_confirmation():
    # zoo bert on the H200 (3m, s36a): the first A/B, compile-model, took 68 s (parity 35 s and
    # warm-up 29 s compiling, timed steps 2 s), and the search stopped with 112 s left because
    # the next A/B and its confirmation were each taken to cost 68 s; compile-blocks, the best
    # peer's form (1.13x), was never tried. A confirmation finds the programs compiled: it costs
    # what the selection did less its compiles
    from dataclasses import replace

    from fakes import Clock, FakeAb, ordered
    from levers.tune.search import search

    fake = FakeAb({"compile-model": 1.0, "compile-blocks": 1.13}, clock=Clock())
    selections = iter([68.0, 40.0])

    def measure(base, stack, time_budget_s, **kw):
        again = (tuple(base), tuple(stack)) in fake.calls
        fake.cost_s = 6.0 if again else next(selections)
        trial = fake(base, stack, time_budget_s, **kw)
        phases = {"parity": 35.0, "warmup": 29.0, "timed": 2.0} if not again else {"timed": 2.0}
        return replace(trial, phase_s=phases)

    result = search(ordered("compile-model", "compile-blocks"), measure, budget_s=180,
                    clock=fake.clock)
    assert [stack for _, stack in fake.calls] == [
        ("compile-model",), ("compile-blocks",), ("compile-blocks",)]
    assert result.stack == ("compile-blocks",)


def test_a_proof_timed_on_the_parity_programs_is_timed_again_as_you_run_it():
    # a compiled stack's A/Bs drew random numbers as eager does: with time left, one more A/B
    # against the baseline times it as you run it, and that one is the proof
    fake = FakeAb({"compiled": 1.5, "fast": 1.2}, eager_random=frozenset({"compiled"}),
                  as_run={("compiled", "fast"): 1.7})
    result = _run(fake, ["compiled", "fast"])
    assert result.stack == ("compiled", "fast")
    assert fake.as_run_asked == [("compiled", "fast")]
    assert result.trials[-1].role == AS_RUN and result.proof is result.trials[-1]
    assert result.proof.tokens_per_s_ratio == 1.7 and not result.proof.timed_eager_random
    assert result.confirmed_by == len(result.trials) - 1


def test_a_proof_timed_as_you_run_it_already_is_not_timed_again():
    fake = FakeAb({"fast": 1.3})
    result = _run(fake, ["fast"])
    assert fake.as_run_asked == [] and result.proof.role == CONFIRMATION


def test_as_you_run_it_a_stack_that_does_not_pay_is_not_the_answer():
    fake = FakeAb({"compiled": 1.5}, eager_random=frozenset({"compiled"}),
                  as_run={("compiled",): 0.97})
    result = _run(fake, ["compiled"])
    assert fake.as_run_asked == [("compiled",)]
    assert result.stack == () and result.proof is None
    assert "nothing is proven as you run it" in " ".join(result.notes)
    assert "no stack with it was proven" in _reason(result, "compiled")


def test_without_the_time_for_one_more_cold_compile_the_proof_stands_and_says_so():
    # the first A/B (its cold compile) took 60 s; 30 s are left after its confirmation
    fake = FakeAb({"compiled": 1.5}, eager_random=frozenset({"compiled"}), costs_s=(60.0, 10.0))
    result = _run(fake, ["compiled"], budget_s=100.0)
    assert fake.as_run_asked == []
    assert result.stack == ("compiled",) and result.proof.timed_eager_random
    assert "no time was left to time it again as you run it" in " ".join(result.notes)


def _moe_like(**kw) -> FakeAb:
    # as glm_moe_dsa on an H100 at c7a70a5 (sides one at a time, 64 GiB a step): whole-model
    # compile paid 1.435x [1.431, 1.438] in an A/B of 148 s, of which ~99 s parity (its first
    # compile); its confirmation needed longer than the 32 s left
    return FakeAb({"compile-model": 1.435, "compile-blocks": 1.3},
                  cold_s={("compile-model",): (148.0, 99.0)}, cost_s=60.0, kills=True, **kw)


def test_a_lever_whose_confirmation_the_budget_cuts_is_unconfirmed_not_refuted():
    """At c7a70a5 tune printed "nothing pays here ... none faster with parity held" where
    whole-model compile had paid 1.435x and only the budget had stopped its confirmation."""
    fake = _moe_like()
    result = _run(fake, ["compile-model", "compile-blocks"], budget_s=180.0)
    assert fake.calls == [((), ("compile-model",)), ((), ("compile-model",))]
    assert result.trials[1].role == CONFIRMATION and result.trials[1].out_of_time
    assert result.stack == () and result.proof is None  # a selection is no proof
    assert result.unconfirmed == ("compile-model",)
    reason = _reason(result, "compile-model")
    assert reason.startswith("pays: tokens/s 1.435x")
    assert "but the budget ran out during its confirmation (A/B 2: time budget of 32 s spent)"\
        in reason and reason.endswith(f"({UNCONFIRMED})")
    # the note: what it paid, and a budget that holds its confirmation (148 s spent, an A/B of
    # a measured stack expected at 148 - (99 - 49) = 98 s: 1.25 x 246 s, in whole minutes)
    assert result.notes == (
        "compile-model paid where it was selected (tokens/s 1.435x [1.425, 1.445]), but the "
        "budget ran out before a fresh A/B could confirm it: it is not kept, and not refuted "
        "either; a --budget of 6m00s or more gives its confirmation time",
    )


def test_a_lever_whose_confirmation_ran_and_did_not_pay_is_refuted_not_unconfirmed():
    fake = FakeAb({"a": 1.3}, again={("a",): 1.0})
    result = _run(fake, ["a"])
    assert result.stack == () and result.unconfirmed == ()
    assert "did not confirm it" in _reason(result, "a")


def test_an_unconfirmed_lever_is_printed_and_recorded_as_such_not_as_nothing_pays():
    import io

    from rich.console import Console

    from levers.tune.measure import TrialDesign
    from levers.tune.render import print_tune
    from levers.tune.result import TuneResult

    searched = _run(_moe_like(), ["compile-model", "compile-blocks"], budget_s=180.0)
    result = TuneResult(workload="arch", params={"model": "glm_moe_dsa"},
                        set_items=("model=glm_moe_dsa",), design=TrialDesign(), device="cuda",
                        search=searched)
    assert not result.nothing_pays and result.unconfirmed == ("compile-model",)
    assert result.confirm_command == "levers ab arch --set model=glm_moe_dsa --lever compile-model"
    record = result.to_dict()
    assert (record["nothing_pays"], record["unconfirmed"], record["stack"]) == (
        False, ["compile-model"], [])
    shown = io.StringIO()
    print_tune(result, Console(file=shown, width=400))
    text = shown.getvalue()
    assert "nothing pays here" not in text
    assert ("nothing proven in the budget: compile-model paid where selected, but the budget ran "
            "out before a fresh A/B could confirm it") in text
    assert "confirm it by hand:\n  levers ab arch --set model=glm_moe_dsa --lever compile-model\n" \
        in text
    assert "--budget of 6m00s or more gives its confirmation time" in text


# where the sides run one at a time (defer_alternatives): a group's first form that pays carries
# the later groups, and its other forms are tried last, in its place
BLOCKS_FIRST = ["compile-blocks", "compile-model", "compile-model:mode=default"]


def _ministral_like(**kw) -> FakeAb:
    # as ministral3 on an H100 (s52, 8 x 2048, sides one at a time): the compile forms 1.298x
    # (per-block, 20 s cold), 1.339x (whole-model, 36.5 s) and 1.349x (default mode, 28.6 s);
    # float8 1.10x on top, its recompile 56.5 s on the whole model; an A/B of a measured stack
    # 12 s. float8 on the blocks is not measured there: 25 s here
    return FakeAb({"compile-blocks": 1.298, "compile-model": 1.339,
                   "compile-model:mode=default": 1.349, "float8": 1.10},
                  cold_s={("compile-blocks",): (20.0, 10.0), ("compile-model",): (36.5, 27.0),
                          ("compile-model:mode=default",): (28.6, 19.0),
                          ("compile-blocks", "float8"): (25.0, 15.0),
                          ("compile-model", "float8"): (60.0, 50.0),
                          ("compile-model:mode=default", "float8"): (56.5, 48.0)},
                  cost_s=12.0, kills=True, **kw)


def _deferred(fake: FakeAb, ids, budget_s: float):
    return search(ordered(*ids), fake, budget_s=budget_s, clock=fake.clock,
                  defer_alternatives=True)


def test_without_deferral_the_compile_forms_eat_the_budget_the_later_lever_needed():
    # what s52 measured: the three forms, then float8 on the fastest; its proof did not fit
    fake = _ministral_like()
    result = _run(fake, [*BLOCKS_FIRST, "float8"], budget_s=180.0)
    assert result.stack == ("compile-model:mode=default",)


def test_deferred_the_first_form_that_pays_carries_the_later_groups_and_the_others_replace_it():
    fake = _ministral_like()
    result = _deferred(fake, [*BLOCKS_FIRST, "float8"], budget_s=300.0)
    blocks, model, default = BLOCKS_FIRST
    assert fake.calls[:8] == [
        ((), (blocks,)), ((), (blocks,)),  # selected, confirmed and kept at once
        ((blocks,), (blocks, "float8")), ((blocks,), (blocks, "float8")),
        ((), (blocks, "float8")),  # proven before any form is tried in the per-block form's place
        # the whole-model form in the per-block form's place, selected and confirmed
        ((blocks, "float8"), (model, "float8")), ((blocks, "float8"), (model, "float8")),
        ((), (model, "float8")),  # and that stack proven
    ]
    # the default mode in the whole-model form's place: 1.007x, its CI holds 1
    assert fake.calls[8] == ((model, "float8"), (default, "float8")) and len(fake.calls) == 9
    assert result.stack == (model, "float8") and result.proof is result.trials[7]
    assert abs(result.proof.tokens_per_s_ratio - 1.339 * 1.10) < 1e-9
    outcome = {o.lever: o for o in result.outcomes}
    assert outcome[model].kept and "in place of compile-blocks; confirmed by a fresh A/B" in (
        outcome[model].reason)
    assert not outcome[blocks].kept
    assert "then replaced by compile-model, which paid 1.032x in its place (A/B 7)" in (
        outcome[blocks].reason)


def test_a_replacement_whose_proof_the_budget_cuts_leaves_the_stack_proven_before_it():
    # at s52's 3 minutes: the whole-model form's recompile under float8 (60 s) leaves its proof
    # too little time; the answer is per-block compile and float8, proven before it was tried
    # (s52's answer, with every compile form tried first: the default mode alone, 0.960 of the
    # best peer)
    fake = _ministral_like()
    result = _deferred(fake, [*BLOCKS_FIRST, "float8"], budget_s=180.0)
    assert result.stack == ("compile-blocks", "float8")
    assert result.proof is result.trials[4] and result.proof.base == ()
    assert result.spent_s <= 180.0
    assert "the answer is compile-blocks,float8, which its proof (A/B 5) proved" in (
        result.notes[-1])
    outcome = {o.lever: o for o in result.outcomes}
    assert outcome["compile-blocks"].kept and outcome["float8"].kept
    assert "kept: the form that replaced it was confirmed, but no stack with it was proven" in (
        outcome["compile-blocks"].reason)
    assert not outcome["compile-model"].kept
    assert _reason(result, "compile-model:mode=default") == OUT_OF_BUDGET


def test_a_form_that_does_not_pay_in_the_place_of_the_kept_one_leaves_the_stack_as_it_was():
    fake = _ministral_like()
    fake.speed["compile-model"] = 1.20
    fake.speed["compile-model:mode=default"] = 1.25
    result = _deferred(fake, [*BLOCKS_FIRST, "float8"], budget_s=1000.0)
    assert result.stack == ("compile-blocks", "float8")
    assert _reason(result, "compile-model").startswith("slower: tokens/s 0.924x")
    # each tried in place of the per-block form, against the stack as it was
    assert ((("compile-blocks", "float8"), ("compile-model:mode=default", "float8"))
            in fake.calls)


def test_a_lone_form_that_replaced_the_first_lever_is_proven_against_the_baseline():
    fake = _ministral_like()
    result = _deferred(fake, BLOCKS_FIRST, budget_s=1000.0)
    # per-block, then whole-model in its place (the default mode in its place: 1.007x, its CI
    # holds 1), then the whole-model form proven against the baseline
    assert result.stack == ("compile-model",)
    assert fake.calls[4:] == [((), ("compile-model",)),
                              (("compile-model",), ("compile-model:mode=default",))]
    assert result.proof is result.trials[4] and result.proof.base == ()


def test_a_replacement_not_proven_against_the_baseline_leaves_the_first_lever_as_the_answer():
    fake = _ministral_like(together={("compile-model",): 0.98})
    result = _deferred(fake, BLOCKS_FIRST[:2], budget_s=1000.0)
    assert result.stack == ("compile-blocks",) and result.selected == ("compile-model",)
    assert result.proof is result.trials[1]  # compile-blocks' confirmation
    outcome = {o.lever: o for o in result.outcomes}
    assert outcome["compile-blocks"].kept
    assert "kept: the form that replaced it was confirmed, but no stack with it was proven" in (
        outcome["compile-blocks"].reason)
    assert not outcome["compile-model"].kept
    assert "the answer is compile-blocks, which its confirmation proved" in result.notes[-1]


def test_deferred_the_fallback_is_not_tried_and_failed_graphs_keep_the_graph_forms_out():
    fake = _convit_like()
    reduce_overhead = "compile-model:mode=reduce-overhead"
    result = _deferred(fake, [*BLOCKS_FIRST, reduce_overhead, GRAPHS], budget_s=1000.0)
    assert "not tried: compile-blocks paid, and this form is only a fallback" in _reason(
        result, GRAPHS)
    # whole-model compile's graphs failed in the per-block form's place; the default mode
    # paid 1.046x there and replaced it; reduce-overhead, the same graphs, was not tried
    assert "CUDAGraphs that has been overwritten" in _reason(result, "compile-model")
    assert result.stack == ("compile-model:mode=default",)
    assert _reason(result, reduce_overhead).startswith(
        "not tried: compile-model's CUDA graphs failed on this step (")
    assert all(GRAPHS not in stack and reduce_overhead not in stack for _, stack in fake.calls)


def test_ctrl_c_inside_a_replacement_keeps_the_stack_proven_before_it():
    from dataclasses import replace

    fake = _ministral_like()

    def stopped_in_the_replacement(base, stack, left_s, *, steps=None):
        trial = fake(base, stack, left_s, steps=steps)
        if "compile-model" in stack:
            return replace(trial, decision="KILLED", killed="interrupted (Ctrl-C) during "
                           "candidate parity step 2", killed_kind="interrupted")
        return trial

    result = search(ordered(*BLOCKS_FIRST, "float8"), stopped_in_the_replacement, budget_s=1e3,
                    clock=fake.clock, defer_alternatives=True)
    assert result.interrupted
    assert result.stack == ("compile-blocks", "float8") and result.proof is result.trials[4]
    assert _reason(result, "compile-model") == (
        "the A/B was stopped: interrupted (Ctrl-C) during candidate parity step 2")
    assert _reason(result, "compile-model:mode=default") == (
        "not tried: the search was interrupted (Ctrl-C)")
    assert all(o.kept for o in result.outcomes if o.lever in result.stack)


def test_a_replacement_whose_ci_holds_one_is_timed_again_longer_in_its_place():
    # the default mode gains 2.4% in the per-block form's place, under jitter whose CI95 holds
    # 1 at 20 steps: timed again in its place, longer, it decides
    fake = _ministral_like(wide={("compile-model:mode=default",): 0.03})
    fake.speed["compile-model:mode=default"] = 1.298 * 1.024
    result = search(ordered(*BLOCKS_FIRST[:1], "compile-model:mode=default"), fake, budget_s=1e3,
                    clock=fake.clock, steps=20, defer_alternatives=True)
    again = [(c, n) for c, n in zip(fake.calls, fake.steps_asked)
             if c == (("compile-blocks",), ("compile-model:mode=default",))]
    assert [n for _, n in again][:2] == [None, 100]  # the selection's own steps, then more
    assert result.stack == ("compile-model:mode=default",)


def test_a_deferred_alternative_that_could_not_beat_the_form_kept_is_not_tried_in_its_place():
    # Liger's kernels clash with per-block compile: a form of its group, tried in its place
    # only where thrice its expected saving could reach what per-block compile paid
    fake = _ministral_like()
    fake.speed["compile-blocks"] = 1.6
    ordered_ = [Candidate("compile-blocks", None, "peer"),
                Candidate("liger-kernels", 0.027, "audit FUSE002: 1.48 ms estimated")]
    result = search(ordered_, fake, budget_s=1e3, clock=fake.clock, defer_alternatives=True)
    assert result.stack == ("compile-blocks",)
    assert all("liger-kernels" not in stack for _, stack in fake.calls)
    assert _reason(result, "liger-kernels").startswith(
        "not tried: compile-blocks paid 1.600x where selected, and this alternative, expected "
        "to save 2.7% of the step")


def test_a_deferred_lever_that_clashes_with_another_form_only_goes_on_top(monkeypatch):
    # a lever grouped with compile's forms for a clash with one of them, not with the form kept
    from levers.tune import candidates as candidates_mod

    real = candidates_mod.conflicts
    monkeypatch.setattr(candidates_mod, "conflicts", lambda: {
        **real(), frozenset({"compile-model", "x"}): "x fails under whole-model compile"})
    fake = _ministral_like()
    fake.speed.update({"compile-blocks": 1.3, "compile-model": 1.2, "x": 1.1})
    result = _deferred(fake, ["compile-blocks", "compile-model", "x"], budget_s=1e3)
    assert (("compile-blocks",), ("compile-blocks", "x")) in fake.calls
    assert result.stack == ("compile-blocks", "x")
    assert _reason(result, "compile-model").startswith("slower")


AUTOTUNED = "compile-model:mode=max-autotune"


def test_the_autotuned_form_is_tried_last_in_place_of_the_compile_form_kept():
    # whole-model compile pays and is kept, float8 pays on top; the autotuned form, whose first
    # step compiles for minutes, waits for both and then replaces the form kept
    fake = FakeAb({"compile-model": 1.5, "compile-blocks": 1.3, AUTOTUNED: 1.6, "float8": 1.1},
                  cost_s=10.0)
    result = _run(fake, ["compile-model", "compile-blocks", AUTOTUNED, "float8"], budget_s=1000.0)
    assert result.stack == (AUTOTUNED, "float8")
    assert fake.calls == [
        ((), ("compile-model",)), ((), ("compile-blocks",)), ((), ("compile-model",)),
        (("compile-model",), ("compile-model", "float8")),
        (("compile-model",), ("compile-model", "float8")),
        ((), ("compile-model", "float8")),  # the stack proven before the replacement
        (("compile-model", "float8"), (AUTOTUNED, "float8")),
        (("compile-model", "float8"), (AUTOTUNED, "float8")),
        ((), (AUTOTUNED, "float8")),  # and the new one after it
    ]
    assert _reason(result, AUTOTUNED).startswith(
        "pays: tokens/s 1.067x [1.057, 1.077] in place of compile-model; confirmed")
    assert result.confirmed_by == 8


BLOCKS_AUTOTUNED = "compile-blocks:mode=max-autotune-no-cudagraphs"


def test_per_block_compile_kept_is_replaced_by_its_own_autotuned_form_not_the_whole_model_s():
    # as the zoo's mistral (H100, s58): per-block compile 1.62x where whole-model compile ran
    # 1.41x, float8 on top; the whole model's autotuned form is not the blocks' rival, their own is
    fake = FakeAb({"compile-model": 1.41, "compile-blocks": 1.62, AUTOTUNED: 1.5,
                   BLOCKS_AUTOTUNED: 1.70, "float8": 1.07}, cost_s=10.0)
    result = _run(fake, ["compile-model", "compile-blocks", AUTOTUNED, BLOCKS_AUTOTUNED, "float8"],
                  budget_s=1000.0)
    assert result.stack == (BLOCKS_AUTOTUNED, "float8")
    assert all(AUTOTUNED not in stack for _, stack in fake.calls)
    assert (("compile-blocks", "float8"), (BLOCKS_AUTOTUNED, "float8")) in fake.calls
    assert _reason(result, AUTOTUNED) == (
        "not tried: compile-blocks was kept, not a form of compile-model, and this form "
        "autotunes compile-model's program")
    assert _reason(result, BLOCKS_AUTOTUNED).startswith("pays: ")
    assert "in place of compile-blocks; confirmed" in _reason(result, BLOCKS_AUTOTUNED)


def test_whole_model_compile_kept_is_not_replaced_by_the_blocks_autotuned_form():
    fake = FakeAb({"compile-model": 1.5, "compile-blocks": 1.3, AUTOTUNED: 1.4,
                   BLOCKS_AUTOTUNED: 1.9}, cost_s=10.0)
    result = _run(fake, ["compile-model", "compile-blocks", AUTOTUNED, BLOCKS_AUTOTUNED],
                  budget_s=1000.0)
    assert result.stack == ("compile-model",)
    assert all(BLOCKS_AUTOTUNED not in stack for _, stack in fake.calls)
    assert ((("compile-model",), (AUTOTUNED,))) in fake.calls  # its own, which was slower
    assert _reason(result, BLOCKS_AUTOTUNED) == (
        "not tried: compile-model was kept, not a form of compile-blocks, and this form "
        "autotunes compile-blocks's program")


def test_the_autotuned_form_is_not_tried_where_no_other_compile_form_paid():
    fake = FakeAb({"compile-model": 0.9, "compile-blocks": 0.95, AUTOTUNED: 1.2, "float8": 1.1})
    result = _run(fake, ["compile-model", "compile-blocks", AUTOTUNED, "float8"])
    assert AUTOTUNED not in {lever for _, stack in fake.calls for lever in stack}
    assert _reason(result, AUTOTUNED) == (
        "not tried: no other form of compile-model paid here, and this one compiles the same "
        "program, for longer (its autotuning)")
    assert result.stack == ("float8",)


def test_an_autotuned_form_that_does_not_pay_in_place_leaves_the_stack_as_it_was():
    fake = FakeAb({"compile-model": 1.5, AUTOTUNED: 1.4, "float8": 1.1})
    result = _run(fake, ["compile-model", AUTOTUNED, "float8"])
    assert result.stack == ("compile-model", "float8")
    assert _reason(result, AUTOTUNED).startswith("slower")


def test_the_autotuned_form_is_not_tried_where_the_step_s_cuda_graphs_failed():
    # it records the step as CUDA graphs, as the form whose graphs failed did
    fake = _convit_like()
    result = _run(fake, [*COMPILE_FORMS, AUTOTUNED], budget_s=1000.0)
    assert result.stack == ("compile-model:mode=default",)
    assert all(AUTOTUNED not in stack for _, stack in fake.calls)
    assert _reason(result, AUTOTUNED).startswith(
        "not tried: compile-model's CUDA graphs failed on this step")


def test_deferred_forms_are_tried_before_the_levers_ordered_by_evidence():
    # as s53's ministral3: the fused loss (0.72x) and the cuDNN attention (1.000x) came after
    # float8 and took 25 s before the whole-model form was tried in per-block compile's place,
    # whose stack's proof the budget then cut. The peers' forms now go first, in place too
    fake = _ministral_like()
    fake.speed.update({"fused-loss": 0.72, "sdpa-cudnn-backend": 1.0})
    result = _deferred(fake, [*BLOCKS_FIRST, "float8", "fused-loss", "sdpa-cudnn-backend"],
                       budget_s=1000.0)
    blocks, model, _ = BLOCKS_FIRST
    stacks = [stack for _, stack in fake.calls]
    first_evidence = min(stacks.index(s) for s in stacks if "fused-loss" in s
                         or "sdpa-cudnn-backend" in s)
    assert stacks.index((model, "float8")) < first_evidence
    assert result.stack == (model, "float8")
    # the levers by evidence were tried on top of the stack the replacement left
    assert ((model, "float8"), (model, "float8", "fused-loss")) in fake.calls


def test_a_deferred_form_of_a_group_after_the_peers_waits_for_the_later_groups():
    # the batch layouts are one group of the levers ordered by evidence: where the sides run one
    # at a time its first form that pays carries the later groups, and its other forms are tried
    # in its place after them, as before the peers' forms went first
    fake = FakeAb({"packing": 1.2, "pad-to-multiple": 1.1, "fused-loss": 1.1})
    result = _deferred(fake, ["packing", "pad-to-multiple", "fused-loss"], budget_s=1000.0)
    stacks = [stack for _, stack in fake.calls]
    assert stacks.index(("packing", "fused-loss")) < stacks.index(("pad-to-multiple", "fused-loss"))
    assert result.stack == ("packing", "fused-loss")
