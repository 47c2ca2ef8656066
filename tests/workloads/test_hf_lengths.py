"""The hf workload's variable-length data (lengths=longtail, lengths=varied) and its refusals."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
from levers.workloads import hf  # noqa: E402


def test_longtail_batches_are_padded_and_tokens_per_step_counts_real_tokens():
    w = hf.build(lengths="longtail", batch_size=4, seq_len=64)
    lengths = w.step.batches.lengths
    assert w.tokens_per_step == sum(lengths) < 4 * max(lengths)
    batch = w.step.batches.draw()
    assert batch["input_ids"].shape == (4, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == list(lengths)
    assert float(w.step()) > 0


def test_unknown_lengths_and_flex_attention_on_a_cpu_are_refused():
    with pytest.raises(ValueError, match="lengths"):
        hf.build(lengths="uniform")
    with pytest.raises(ValueError, match="only on a GPU"):
        hf.build(attn="flex_attention")


def test_varied_batches_are_padded_to_each_steps_own_longest():
    from levers.batches import varied_lengths, varied_mean_tokens

    w = hf.build(lengths="varied", batch_size=8, seq_len=128, seed=2)
    assert w.step.batches.lengths is None  # they vary: the layouts read them from the mask
    assert w.params["lengths"] == "varied"
    assert w.tokens_per_step == varied_mean_tokens(8, 128)
    widths = []
    for k in range(6):
        lengths = varied_lengths(8, 128, seed=2, step=k)
        batch = w.step.batches.next()
        assert batch["input_ids"].shape == (8, max(lengths))  # dynamic padding
        assert batch["attention_mask"].sum(1).tolist() == list(lengths)
        assert bool((batch["labels"][batch["attention_mask"] == 0] == -100).all())
        widths.append(batch["input_ids"].shape[1])
    assert len(set(widths)) > 2


def test_two_varied_workloads_from_one_seed_see_the_same_batches():
    a, b = (hf.build(lengths="varied", batch_size=4, seq_len=64) for _ in range(2))
    for _ in range(3):
        batch_a, batch_b = a.step.batches.next(), b.step.batches.next()
        assert all(torch.equal(batch_a[k], batch_b[k]) for k in batch_a)
    assert float(a.step()) == float(b.step())

    def lengths(seed):
        w = hf.build(lengths="varied", batch_size=4, seq_len=64, seed=seed)
        return [w.step.batches.next()["attention_mask"].sum(1).tolist() for _ in range(3)]

    assert lengths(0) != lengths(1)
