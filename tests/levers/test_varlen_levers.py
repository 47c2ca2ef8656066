"""The data levers (packing, padding-free, pad-to-multiple) on the hf workload's padded
variable-length batches (the same lengths every step, and lengths=varied, drawn afresh each
step): the loss per real token and the gradients of the changed step equal
the padded step's within the lever's tolerance (fp32, CPU), a planted wrong packing (no document
mask, positions not restarted) fails that same check, and the levers refuse what would let
attention cross documents."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.batches import Batches, draw_padded, pack, varied_lengths
from levers.levers import load_all
from levers.levers.lever import NotApplicable
from levers.workload import Workload

from lever_parity import assert_close, relative, run_steps

pytest.importorskip("transformers")
from levers.workloads import hf  # noqa: E402

DATA_LEVERS = ("packing", "padding-free", "pad-to-multiple")
# measured on this CPU in fp32 (2 steps, tiny llama, 8 long-tailed sequences): loss equal to
# the bit, gradients within 6e-7 of the padded step's (max-norm); a leak moves them by ~0.8
MEASURED_GRAD_RTOL = 1e-6


def varlen(attn: str = "sdpa", **params) -> Workload:
    return hf.build(**{"lengths": "longtail", "batch_size": 8, "seq_len": 128, "attn": attn,
                       **params})


def model_widths(workload: Workload) -> list[tuple[int, ...]]:
    """The shapes of the ``input_ids`` the model gets, one per forward, appended as it runs."""
    shapes: list[tuple[int, ...]] = []
    workload.model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)),
        with_kwargs=True,
    )
    return shapes


def worst(a, b) -> float:
    """The largest relative difference of the two traces' losses and gradients."""
    out = max(relative(la, lb) for la, lb in zip(a.losses, b.losses))
    for ga, gb in zip(a.grads, b.grads):
        out = max(out, *(relative(ga[n], gb[n]) for n in ga))
    return out


def test_the_workload_pads_long_tailed_lengths_and_counts_real_tokens():
    w = varlen()
    lengths = w.step.batches.lengths
    assert w.tokens_per_step == sum(lengths)
    assert sum(lengths) / len(lengths) <= 128 / 4 and max(lengths) <= 128
    batch = w.step.batches.next()
    assert batch["input_ids"].shape == (8, max(lengths))
    assert int(batch["attention_mask"].sum()) == w.tokens_per_step
    assert bool((batch["labels"][batch["attention_mask"] == 0] == -100).all())
    assert w.params["lengths"] == "longtail"
    assert "lengths" not in hf.build().params  # the fixed-length workload is unchanged


@pytest.mark.parametrize("lever_id", DATA_LEVERS)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_lever_keeps_the_padded_steps_loss_and_gradients(lever_id, attn):
    padded = run_steps(varlen(attn))
    candidate = varlen(attn)
    spec = "pad-to-multiple:multiple=48" if lever_id == "pad-to-multiple" else lever_id
    levers.apply(candidate, spec)
    changed = run_steps(candidate)
    tolerance = load_all()[lever_id].tolerance
    assert worst(changed, padded) <= MEASURED_GRAD_RTOL <= tolerance
    assert_close(changed, padded, tolerance)


@pytest.mark.parametrize("lever_id", DATA_LEVERS)
def test_the_lever_keeps_the_padded_steps_loss_and_gradients_when_lengths_vary(lever_id):
    # lengths=varied: fresh lengths and a new padded width every step, read from the mask
    padded_w = varlen(lengths="varied")
    padded_shapes = model_widths(padded_w)
    padded = run_steps(padded_w, num_steps=3)
    candidate = varlen(lengths="varied")
    spec = "pad-to-multiple:multiple=48" if lever_id == "pad-to-multiple" else lever_id
    levers.apply(candidate, spec)
    assert candidate.step.batches.layout == lever_id and candidate.step.batches.lengths is None
    shapes = model_widths(candidate)
    changed = run_steps(candidate, num_steps=3)
    lengths = [varied_lengths(8, 128, seed=0, step=k) for k in range(3)]
    widths = [max(n) for n in lengths]
    assert padded_shapes == [(8, w) for w in widths] and len(set(widths)) == 3
    if lever_id == "pad-to-multiple":
        assert shapes == [(8, -(-w // 48) * 48) for w in widths]
    elif lever_id == "packing":  # rows as wide as the step's padded batch, fewer of them
        assert all(s[1] == w and s[0] < 8 for s, w in zip(shapes, widths))
    else:  # one row of the step's real tokens
        assert shapes == [(1, sum(n)) for n in lengths]
    tolerance = load_all()[lever_id].tolerance
    assert worst(changed, padded) <= MEASURED_GRAD_RTOL <= tolerance
    assert_close(changed, padded, tolerance)


def _planted(wrong: str):
    def transform(batch):
        out = pack(batch)
        if wrong == "positions":  # positions run on through the row: no restart, no documents
            out["position_ids"] = torch.arange(out["input_ids"].shape[1]).expand_as(
                out["input_ids"]
            )
        else:  # a full attention mask: transformers then ignores the restarts
            out["attention_mask"] = torch.ones_like(out["input_ids"])
        return out

    return transform


@pytest.mark.parametrize("wrong", ["positions", "mask"])
def test_a_planted_wrong_packing_fails_the_same_check(wrong):
    padded = run_steps(varlen())
    candidate = varlen()
    candidate.step.batches.transforms.append(("packing", _planted(wrong)))
    changed = run_steps(candidate)
    assert worst(changed, padded) > 1000 * load_all()["packing"].tolerance
    with pytest.raises(AssertionError):
        assert_close(changed, padded, load_all()["packing"].tolerance)


def test_undo_restores_the_padded_batches():
    w = varlen()
    handle = levers.apply(w, "packing")
    assert "attention_mask" not in w.step.batches.next()
    handle.undo()
    assert w.step.batches.transforms == [] and w.step.batches.layout == "padded"
    assert "attention_mask" in w.step.batches.next()


@pytest.mark.parametrize("lever_id", ["packing", "padding-free"])
def test_refused_when_transformers_would_not_keep_documents_apart(lever_id, monkeypatch):
    import transformers.masking_utils as masking

    # as if transformers no longer read the position restarts: the probe sees the leak
    monkeypatch.setattr(masking, "find_packed_sequence_indices", lambda position_ids: None)
    with pytest.raises(NotApplicable, match="attention crosses documents"):
        levers.apply(varlen(), lever_id)


def test_packed_rows_are_refused_under_flash_attention_but_one_row_is_allowed_by_name():
    w = varlen()
    w.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(NotApplicable, match="only in a batch of one row"):
        levers.apply(w, "packing")
    # padding-free is allowed by name; here the probe cannot run flash attention, so refused
    with pytest.raises(NotApplicable, match="could not run"):
        levers.apply(w, "padding-free")


def test_refused_on_a_model_that_is_not_a_transformers_model():
    model = torch.nn.Linear(4, 4)
    step = lambda: None  # noqa: E731
    step.batches = Batches(draw=lambda: {}, lengths=(3, 5))
    w = Workload(model=model, step=step)
    with pytest.raises(NotApplicable, match="not a Hugging Face transformers model"):
        levers.apply(w, "packing")
    levers.apply(w, "pad-to-multiple").undo()  # padding needs no attention check


def test_refused_without_padding_or_batches():
    with pytest.raises(NotApplicable, match="exposes no batches"):
        levers.apply(hf.build(), "padding-free")
    w = varlen()
    w.step.batches.lengths = (16, 16)
    with pytest.raises(NotApplicable, match="no padding"):
        levers.apply(w, "packing")
    w = varlen()
    levers.apply(w, "packing")
    with pytest.raises(NotApplicable, match="already laid out without padding"):
        levers.apply(w, "padding-free")
    with pytest.raises(NotApplicable, match="already a multiple"):
        levers.apply(varlen(), f"pad-to-multiple:multiple={max(varlen().step.batches.lengths)}")
    with pytest.raises(ValueError, match="positive"):
        levers.apply(varlen(), "packing:row_len=-3")


def test_packing_fills_fewer_rows_than_the_padded_batch():
    w = varlen()
    lengths = w.step.batches.lengths
    levers.apply(w, "packing")
    batch = w.step.batches.next()
    rows, width = batch["input_ids"].shape
    assert width == max(lengths) and rows < len(lengths)
    assert int((batch["labels"] != -100).sum()) == sum(n - 1 for n in lengths)


def test_the_step_is_found_through_a_wrapping_lever():
    w = varlen()
    levers.apply(w, "autocast-bf16,packing")
    assert w.step.batches.layout == "packing"
    generator = torch.Generator().manual_seed(0)
    assert draw_padded((3, 1), 10, generator)["input_ids"].shape == (2, 3)


def test_the_capture_says_which_layout_the_step_draws_and_pad001_sees_the_padding():
    from levers.capture.step import capture_step

    w = varlen()
    capture = capture_step(w)
    assert capture.settings["batches"] == "padded"
    loss = max((c for c in capture.calls if c.kind == "loss"), key=lambda c: c.args["num_targets"])
    padded_width = max(w.step.batches.lengths)
    assert loss.args["num_targets"] == 8 * padded_width
    assert loss.args["num_ignored"] == 8 * padded_width - (w.tokens_per_step - 8)
    levers.apply(w, "packing")
    assert capture_step(w).settings["batches"] == "packing"
    assert capture_step(hf.build()).settings["batches"] is None


@pytest.mark.parametrize("arch", ["qwen2", "gemma", "mistral"])
def test_packing_keeps_the_padded_step_on_the_other_architectures(arch):
    padded = run_steps(varlen(arch=arch))
    candidate = varlen(arch=arch)
    levers.apply(candidate, "packing")
    assert worst(run_steps(candidate), padded) <= MEASURED_GRAD_RTOL


def test_a_model_that_keeps_a_kv_cache_gets_it_turned_off_while_packed():
    # transformers reads the position restarts only without a cache; a config as shipped
    # (use_cache=True) builds one in every forward, training included
    padded_w = varlen()
    padded_w.model.config.use_cache = True
    padded = run_steps(padded_w)
    candidate = varlen()
    candidate.model.config.use_cache = True
    handle = levers.apply(candidate, "packing")
    assert candidate.model.config.use_cache is False
    assert worst(run_steps(candidate), padded) <= MEASURED_GRAD_RTOL
    handle.undo()
    assert candidate.model.config.use_cache is True
    # the leak the switch prevents: packed rows with the cache on
    leaking = varlen()
    levers.apply(leaking, "packing")
    leaking.model.config.use_cache = True
    assert worst(run_steps(leaking), padded) > 1000 * load_all()["packing"].tolerance
