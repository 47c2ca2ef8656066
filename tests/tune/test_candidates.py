"""Which levers the search tries, in which order, and why the others are left out."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from levers.audit.finding import Cost, Finding, Receipt
from levers.levers.catalogue import Measurement
from levers.tune.candidates import (
    OBSERVES_ONLY,
    Candidate,
    Skipped,
    candidates,
    exclusive_with,
    groups,
)


def _lever(id, *, needs_gpu=False, choose_params=None, applies=None):
    return SimpleNamespace(id=id, needs_gpu=needs_gpu, choose_params=choose_params,
                           applies_reason=applies)


def _applies(lever):
    return lever.applies_reason


def _finding(code, lever, saved_ms):
    return Finding(
        code=code, name="n", message="m", fix_title="f",
        receipts=(Receipt("x.py", 1, "x"),), severity="low", effort="S", risk="low",
        lever=lever, cost=Cost("estimated", now_ms=saved_ms, fixed_ms=0.0),
    )


def _row(lever, ratio, status="ok"):
    return Measurement(lever, (lever,), "hf", "s", "b", status, ratio, (ratio, ratio),
                       None, None, None, "h200", "2.11", "c", "d")


REGISTRY = {
    "a": _lever("a"), "b": _lever("b"), "c": _lever("c"), "d": _lever("d"),
    "gpu-only": _lever("gpu-only", needs_gpu=True),
    "batch": _lever("batch", choose_params=lambda *a: None),
    "no": _lever("no", applies="no blocks"),
}


def test_the_largest_expected_saving_first_the_audit_s_on_a_tie():
    ordered, skipped = candidates(
        REGISTRY, _applies,
        findings=[_finding("X001", "b", 1.0), _finding("X002", "c", 3.0)], step_ms=10.0,
        catalogue_rows=[_row("a", 1.1), _row("d", 1.4), _row("d", 1.2)],
    )
    assert [c.lever for c in ordered] == ["c", "d", "b", "a"]
    assert ordered[0].expected == pytest.approx(0.3)
    assert ordered[0].source == "audit X002: 3 ms estimated"
    assert ordered[1].expected == pytest.approx(0.3)  # median of 1.4 and 1.2, less 1
    reasons = {s.lever: s.reason for s in skipped}
    assert reasons["no"] == "does not apply: no blocks"
    assert reasons["gpu-only"].startswith("its speed-up exists only on a GPU")
    assert "changes the factory's parameters" in reasons["batch"]


def test_gpu_levers_are_tried_on_a_gpu():
    ordered, _ = candidates(REGISTRY, _applies, on_gpu=True)
    assert "gpu-only" in [c.lever for c in ordered]


def test_only_and_exclude_restrict_the_search_and_unknown_ids_are_refused():
    ordered, skipped = candidates(REGISTRY, _applies, only=["a", "b"], exclude=["b"])
    assert [c.lever for c in ordered] == ["a"]
    assert [s.reason for s in skipped] == ["left out with --exclude"]
    with pytest.raises(ValueError, match="unknown lever 'zzz'"):
        candidates(REGISTRY, _applies, only=["zzz"])


def test_a_lever_that_needs_options_says_where_to_give_them():
    """ac-budget needs a budget a speed search does not choose: tune says to A/B it with one
    (defect N22: its reason read as an option tune would take), and refuses it with options."""
    needs = _lever("needs", applies="it needs a budget: needs:budget=20GiB")
    _, skipped = candidates({"needs": needs}, _applies, ab_prefix="levers ab demo")
    assert skipped[0].reason == (
        "does not apply without options: it needs a budget: needs:budget=20GiB; levers tune "
        "tries each lever as it is: A/B it with them, levers ab demo --lever needs:..."
    )
    with pytest.raises(ValueError, match=r"levers tune tries each lever as it is, without "
                       r"options \('needs:budget=1GiB' has some\)"):
        candidates({"needs": needs}, _applies, only=["needs:budget=1GiB"])


def test_an_applies_check_that_raises_leaves_the_lever_out_with_why():
    def boom(lever):
        raise RuntimeError("probe failed")

    _, skipped = candidates({"a": _lever("a")}, boom)
    assert skipped[0].reason == "its applies check raised RuntimeError: probe failed"


def test_compile_forms_checkpointing_policies_and_known_clashes_are_alternatives():
    assert exclusive_with("compile-model", ["compile-blocks"]) == "compile-blocks"
    assert exclusive_with("ac-full", ["x", "ac-budget"]) == "ac-budget"
    assert exclusive_with("liger-kernels", ["compile-blocks"]) == "compile-blocks"
    assert exclusive_with("rms-norm-fused", ["fused-optimizer"]) is None
    from levers.tune.candidates import Candidate

    ordered = [Candidate(i, None, "") for i in ("compile-blocks", "x", "compile-model", "ac-full")]
    assert [[c.lever for c in g] for g in groups(ordered)] == [
        ["compile-blocks", "compile-model"], ["x"], ["ac-full"],
    ]


def test_the_data_levers_are_candidates_on_padded_batches_and_one_group():
    pytest.importorskip("transformers")
    from levers.levers import load_all
    from levers.levers.lever import target_of
    from levers.workloads import hf

    registry = {k: v for k, v in load_all().items()
                if k in ("packing", "padding-free", "pad-to-multiple")}
    padded = hf.build(lengths="longtail", batch_size=8, seq_len=64)
    tried, skipped = candidates(
        registry, lambda lever: lever.applies(target_of(padded)), on_gpu=True
    )
    assert [c.lever for c in tried] == ["packing", "pad-to-multiple", "padding-free"]
    assert len(groups(tried)) == 1 and skipped == []
    fixed = hf.build()
    tried, skipped = candidates(registry, lambda lever: lever.applies(target_of(fixed)))
    assert tried == [] and all("exposes no batches" in s.reason or "GPU" in s.reason
                               for s in skipped)


def test_a_lever_that_pays_only_on_another_is_tried_after_it():
    from levers.tune.candidates import after_their_base

    registry = {
        "float8": SimpleNamespace(id="float8", measured_on=("compile-blocks",)),
        "compile-blocks": SimpleNamespace(id="compile-blocks", measured_on=()),
        "sdpa-attention": SimpleNamespace(id="sdpa-attention", measured_on=()),
    }
    ordered = [Candidate(i, None, "test") for i in ("float8", "sdpa-attention", "compile-blocks")]
    assert [c.lever for c in after_their_base(ordered, registry)] == [
        "sdpa-attention", "compile-blocks", "float8",
    ]
    # already after it, or its base not a candidate: the order stands
    assert [c.lever for c in after_their_base(ordered[1:], registry)] == [
        "sdpa-attention", "compile-blocks",
    ]
    alone = [Candidate("float8", None, "test"), Candidate("sdpa-attention", None, "test")]
    assert after_their_base(alone, registry) == alone


def _gpu_lever(id, measured_on=(), slower=None):
    return SimpleNamespace(id=id, needs_gpu=True, choose_params=None, applies_reason=None,
                           measured_on=measured_on, slower_here=slower)


PEERS_REGISTRY = {
    "compile-model": _gpu_lever("compile-model"),
    "compile-blocks": _gpu_lever("compile-blocks"),
    "float8": _gpu_lever("float8", measured_on=("compile-blocks",)),
    "fused-loss": _gpu_lever("fused-loss"),
    "ac-full": _gpu_lever("ac-full"),
}


def test_on_a_gpu_the_peers_forms_come_first_whatever_the_estimates():
    # the case: the fused loss estimated at 11.7 ms of a 100 ms step, compile unpriced
    ordered, _ = candidates(
        PEERS_REGISTRY, _applies, on_gpu=True,
        findings=[_finding("LOSS002", "fused-loss", 11.7)], step_ms=100.0,
        forms={"compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs")},
    )
    assert [c.lever for c in ordered] == [
        "compile-model", "compile-blocks", "compile-model:mode=default",
        "compile-model:backend=cudagraphs", "float8", "fused-loss", "ac-full",
    ]
    assert ordered[0].source.startswith("a peer's form")
    assert ordered[2].source.startswith("another form of compile-model")
    # the fallback says what it is and when it is tried
    assert ordered[3].source.startswith(
        "another form of compile-model: the step's own kernels replayed as CUDA graphs, "
        "without inductor")
    assert ordered[3].source.endswith("tried where no inductor form of compile paid in the time "
                                      "it had")
    # the forms of compile-model and compile-blocks are one group of alternatives, the
    # fallback last
    assert [[c.lever for c in g] for g in groups(ordered)][0] == [
        "compile-model", "compile-blocks", "compile-model:mode=default",
        "compile-model:backend=cudagraphs",
    ]


def test_the_blocks_cuda_graph_fallback_comes_just_before_the_step_s_own_graphs():
    """Two fallbacks of the compile group, in FALLBACK_FORMS' order at the group's end: the
    blocks' programs under CUDA graphs (inception_resnet_v2, H100, s65: 1.87x after a 27-s
    warm-up), then the step's own kernels as graphs (1.17x there, s64), whichever order the
    peers' forms take."""
    forms = {"compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs"),
             "compile-blocks": ("compile-blocks:mode=reduce-overhead",)}
    for blocks_first, head in ((False, ["compile-model", "compile-blocks"]),
                               (True, ["compile-blocks", "compile-model"])):
        ordered, _ = candidates(PEERS_REGISTRY, _applies, on_gpu=True, forms=forms,
                                blocks_first=blocks_first)
        assert [[c.lever for c in g] for g in groups(ordered)][0] == [
            *head, "compile-model:mode=default", "compile-blocks:mode=reduce-overhead",
            "compile-model:backend=cudagraphs",
        ]
        blocks_graphs = next(c for c in ordered if c.lever == "compile-blocks:mode=reduce-overhead")
        assert blocks_graphs.source.startswith(
            "another form of compile-blocks: each repeated block's program replayed as CUDA "
            "graphs")


def test_where_the_sides_run_one_at_a_time_per_block_compile_comes_first():
    """Each A/B builds its sides one at a time where two steps do not fit the GPU, and the
    budget holds few: per-block compile, which compiles each distinct block once, goes before
    whole-model compile (glm_moe_dsa's whole-model selection took 148 s of 3 minutes, s50); the
    other forms keep their order, and the group is still one group, the fallback last."""
    forms = {"compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs")}
    ordered, _ = candidates(PEERS_REGISTRY, _applies, on_gpu=True, forms=forms,
                            blocks_first=True)
    assert [c.lever for c in ordered][:5] == [
        "compile-blocks", "compile-model", "compile-model:mode=default",
        "compile-model:backend=cudagraphs", "float8",
    ]
    assert [[c.lever for c in g] for g in groups(ordered)][0] == [
        "compile-blocks", "compile-model", "compile-model:mode=default",
        "compile-model:backend=cudagraphs",
    ]
    # an MoE's reduce-overhead form has its place among the forms too
    ordered, _ = candidates(PEERS_REGISTRY, _applies, on_gpu=True, blocks_first=True,
                            forms={"compile-model": ("compile-model:mode=reduce-overhead",)})
    assert [c.lever for c in ordered][:3] == [
        "compile-blocks", "compile-model", "compile-model:mode=reduce-overhead"]


def test_on_a_gpu_convnet_the_compile_forms_come_first_and_channels_last_follows_on_top():
    """timm's --channels-last is a peer's form too, tried after the compile forms (the CUDA-graph
    fallback among them), on top of the one kept: inductor gains as much without it, and
    channels-last kept first held a compiled stack below compile alone (s50, H100)."""
    registry = {**PEERS_REGISTRY, "channels-last": _gpu_lever("channels-last")}
    ordered, _ = candidates(
        registry, _applies, on_gpu=True,
        forms={"compile-model": ("compile-model:backend=cudagraphs",)},
    )
    levers = [c.lever for c in ordered]
    assert levers[:4] == [
        "compile-model", "compile-blocks", "compile-model:backend=cudagraphs", "channels-last",
    ]
    assert ordered[3].source.startswith("a peer's form (whole-model or per-block compile, a "
                                        "convnet's channels-last")
    first, second = [[c.lever for c in g] for g in groups(ordered)][:2]
    assert first[0] == "compile-model" and first[-1] == "compile-model:backend=cudagraphs"
    assert second == ["channels-last"]  # its own group: tried on top of the compile form kept


def test_on_a_gpu_what_compile_would_compile_is_set_before_the_compile_forms():
    """bf16 autocast, an MoE's experts as grouped matmuls and their cast to bf16 change what the
    compile forms compile (an MoE with fp32 experts sent its compiled expert matmuls to
    transformers' per-expert fallback): tried first, before any peer's form, whatever the
    estimates say."""
    registry = {**PEERS_REGISTRY, "grouped-mm-autocast": _gpu_lever("grouped-mm-autocast"),
                "autocast-bf16": _gpu_lever("autocast-bf16"),
                "experts-grouped-mm": _gpu_lever("experts-grouped-mm")}
    casts = [_finding("DTYPE001", "autocast-bf16", 5.0),
             _finding("DTYPE002", "grouped-mm-autocast", 3.0)]
    ordered, _ = candidates(
        registry, _applies, on_gpu=True,
        findings=[_finding("LOSS002", "fused-loss", 90.0), *casts], step_ms=100.0,
    )
    levers = [c.lever for c in ordered]
    assert levers[:5] == ["autocast-bf16", "experts-grouped-mm", "grouped-mm-autocast",
                          "compile-model", "compile-blocks"]
    assert ordered[2].source.startswith("it changes what compile compiles (the precision of the "
                                        "matmuls, the experts' implementation): tried before "
                                        "the compile forms")
    # each its own group: kept, the compile forms are tried on top of it
    assert [[c.lever for c in g] for g in groups(ordered)][:3] == [
        ["autocast-bf16"], ["experts-grouped-mm"], ["grouped-mm-autocast"]]
    # where one does not apply (the step runs under autocast already), it is left out
    registry["autocast-bf16"] = SimpleNamespace(**{**vars(registry["autocast-bf16"]),
                                                    "applies_reason": "already under autocast"})
    ordered, skipped = candidates(registry, _applies, on_gpu=True, findings=casts,
                                  step_ms=100.0)
    assert [c.lever for c in ordered][:2] == ["experts-grouped-mm", "grouped-mm-autocast"]
    assert ("autocast-bf16", "does not apply: already under autocast") in [
        (k.lever, k.reason) for k in skipped]


def test_on_a_gpu_the_casts_come_first_only_where_the_audit_found_what_they_fix():
    """The two casts go before the compile forms where the audit of this step found fp32
    matmuls; without that finding (glm_moe_dsa, H100 s51: the experts' cast first on the
    catalogue's 2.22x measured 0.999x and took 108 s of a 3-minute budget) they take their place
    by evidence, after the peers' forms. The experts' grouped matmuls, which no rule prices, stay
    first."""
    registry = {**PEERS_REGISTRY, "grouped-mm-autocast": _gpu_lever("grouped-mm-autocast"),
                "autocast-bf16": _gpu_lever("autocast-bf16"),
                "experts-grouped-mm": _gpu_lever("experts-grouped-mm")}
    ordered, _ = candidates(registry, _applies, on_gpu=True)
    levers = [c.lever for c in ordered]
    assert levers[0] == "experts-grouped-mm" and levers[1] == "compile-model"
    assert levers.index("grouped-mm-autocast") > levers.index("compile-blocks")
    assert levers.index("autocast-bf16") > levers.index("compile-blocks")
    assert not next(c for c in ordered if c.lever == "grouped-mm-autocast").source.startswith(
        "it changes what compile compiles")
    # the audit's finding of the experts' fp32 grouped matmuls puts their cast first again
    ordered, _ = candidates(registry, _applies, on_gpu=True, step_ms=100.0,
                            findings=[_finding("DTYPE002", "grouped-mm-autocast", 3.0)])
    assert [c.lever for c in ordered][:3] == [
        "experts-grouped-mm", "grouped-mm-autocast", "compile-model"]


def test_on_a_cpu_the_estimates_order_as_before():
    registry = {k: SimpleNamespace(**{**vars(v), "needs_gpu": False})
                for k, v in PEERS_REGISTRY.items()}
    ordered, _ = candidates(
        registry, _applies, findings=[_finding("LOSS002", "fused-loss", 11.7)], step_ms=100.0,
    )
    assert ordered[0].lever == "fused-loss"


def test_a_lever_its_catalogue_measured_slower_every_time_is_left_out_with_why():
    rows = [_row("ac-full", 0.76), _row("ac-full", 0.64), _row("fused-loss", 0.9),
            _row("fused-loss", 1.2)]
    ordered, skipped = candidates(PEERS_REGISTRY, _applies, on_gpu=True, catalogue_rows=rows)
    reasons = {s.lever: s.reason for s in skipped}
    assert reasons["ac-full"].startswith("measured slower: the catalogue measured it slower")
    assert "0.70x tokens/s (median of 2, 0.64-0.76x" in reasons["ac-full"]
    # one row faster, one slower: its regime is not known to lose, so it is tried
    assert "fused-loss" in [c.lever for c in ordered]
    # named with --lever, it is tried all the same
    ordered, skipped = candidates(
        PEERS_REGISTRY, _applies, on_gpu=True, catalogue_rows=rows, only=["ac-full"]
    )
    assert [c.lever for c in ordered] == ["ac-full"]


def test_a_lever_that_pays_only_on_another_is_not_judged_by_its_rows_alone():
    rows = [_row("float8", 0.9)]  # float8 timed eager: slower, as its regime says
    ordered, _ = candidates(PEERS_REGISTRY, _applies, on_gpu=True, catalogue_rows=rows)
    assert "float8" in [c.lever for c in ordered]


def test_a_lever_measured_on_another_is_left_out_by_its_own_check_of_this_model():
    # float8's regime check is taken on top of compile (narrow matmuls lost 0.93-0.96x there)
    registry = {**PEERS_REGISTRY, "float8": _gpu_lever(
        "float8", measured_on=("compile-blocks",), slower=lambda target: "narrow matmuls")}
    ordered, skipped = candidates(
        registry, _applies, on_gpu=True,
        slower_of=lambda lever: lever.slower_here(None) if lever.slower_here else None,
    )
    assert "float8" not in [c.lever for c in ordered]
    assert {s.lever: s.reason for s in skipped}["float8"] == (
        "measured slower in this regime: narrow matmuls")


def test_a_lever_that_says_it_is_slower_here_is_left_out_with_its_reason():
    registry = {**PEERS_REGISTRY,
                "fused-loss": _gpu_lever("fused-loss", slower=lambda target: "chunked kernel")}
    _, skipped = candidates(
        registry, _applies, on_gpu=True,
        slower_of=lambda lever: lever.slower_here(None) if lever.slower_here else None,
    )
    reasons = {s.lever: s.reason for s in skipped}
    assert reasons["fused-loss"] == "measured slower in this regime: chunked kernel"


def test_a_lever_that_judges_its_own_regime_is_not_left_out_by_rows_of_other_shapes():
    # the fused loss's one catalogue row ran slower (a 32k vocabulary); its own check says
    # this model is not that regime: it is tried. ac-full, with no check of its own, is not
    rows = [_row("fused-loss", 0.98), _row("ac-full", 0.76)]
    registry = {**PEERS_REGISTRY,
                "fused-loss": _gpu_lever("fused-loss", slower=lambda target: None)}
    ordered, skipped = candidates(
        registry, _applies, on_gpu=True, catalogue_rows=rows,
        slower_of=lambda lever: lever.slower_here(None) if lever.slower_here else None,
    )
    assert "fused-loss" in [c.lever for c in ordered]
    assert [s.lever for s in skipped] == ["ac-full"]


def test_forms_of_one_lever_exclude_each_other():
    assert exclusive_with("compile-model:mode=default", ["compile-model"]) == "compile-model"
    assert exclusive_with("compile-model:mode=default", ["compile-blocks"]) == "compile-blocks"
    assert exclusive_with("float8", ["compile-model:mode=default"]) is None


def test_a_lever_that_only_observes_the_step_is_no_speed_candidate_even_when_named():
    registry = {"a": _lever("a"), "metric": SimpleNamespace(**vars(_lever("metric")),
                                                              observes_only=True)}
    for only in (None, ["a", "metric"]):  # --lever names it: still nothing to find
        ordered, skipped = candidates(registry, _applies, on_gpu=True, only=only)
        assert [c.lever for c in ordered] == ["a"]
        assert skipped == [Skipped("metric", OBSERVES_ONLY)]


def test_the_catalogue_s_metric_lever_is_declared_observe_only_and_the_others_are_not():
    from levers.levers import load_all

    registry = load_all()
    assert [i for i, lever in registry.items() if lever.observes_only] == ["windowed-peak-metric"]


def test_the_autotuned_compile_form_comes_last_in_its_group_after_every_peer_s_form():
    """Where the budget holds it (lever_forms gives it at the default budget or more), whole-model
    compile with inductor's autotuning is the group's last form: after the fallback and after the
    peers' later forms (float8), so that the search reaches it, deferred, last of all."""
    blocks = "compile-blocks:mode=max-autotune-no-cudagraphs"
    forms = {"compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs",
                               "compile-model:mode=max-autotune"),
             "compile-blocks": (blocks,)}
    for blocks_first in (False, True):
        ordered, _ = candidates(PEERS_REGISTRY, _applies, on_gpu=True, forms=forms,
                                blocks_first=blocks_first)
        levers = [c.lever for c in ordered]
        # both autotuned forms after float8, the last of the compile group
        assert levers[levers.index("float8") + 1:][:2] == [
            blocks, "compile-model:mode=max-autotune"]
        assert [c.lever for c in groups(ordered)[0]][-2:] == [
            blocks, "compile-model:mode=max-autotune"]
        assert ordered[levers.index("compile-model:mode=max-autotune")].source.startswith(
            "another form of compile-model")
        assert ordered[levers.index(blocks)].source.startswith("another form of compile-blocks")


def test_the_compiled_loss_follows_float8_as_torchtitan_s_recipe_and_whole_model_compile_covers_it():
    from levers.tune.candidates import covered_by

    registry = {**PEERS_REGISTRY, "compile-loss": _gpu_lever("compile-loss")}
    ordered, _ = candidates(
        registry, _applies, on_gpu=True,
        findings=[_finding("LOSS002", "fused-loss", 11.7)], step_ms=100.0,
    )
    ids = [c.lever for c in ordered]
    assert ids.index("compile-loss") == ids.index("float8") + 1
    assert ids.index("compile-loss") < ids.index("fused-loss")
    assert ordered[ids.index("compile-loss")].source.startswith("a peer's form")
    # not an alternative to either compile form: it stacks on per-block compile
    assert exclusive_with("compile-loss", ["compile-blocks", "float8"]) is None
    # whole-model compile compiles the loss with the model; the fused loss never calls it
    assert covered_by("compile-loss", ["compile-model"]) == "compile-model"
    assert covered_by("compile-loss", ["compile-blocks", "fused-linear-cross-entropy"]) == (
        "fused-linear-cross-entropy")
    assert covered_by("compile-loss", ["compile-blocks", "float8"]) is None
    # both set a causal LM's loss_function: alternatives
    assert exclusive_with("compile-loss", ["loss-valid-rows"]) == "loss-valid-rows"
