"""levers.batches: the padded batch, and the packed, flattened and rounded layouts of it."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from levers.batches import (
    IGNORE_INDEX,
    Batches,
    batches_of,
    first_fit_decreasing,
    flatten,
    longtail_lengths,
    pack,
    pad_to_multiple,
    padded,
    varied_lengths,
    varied_mean_tokens,
)

SEQS = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([9, 10, 11, 12, 13]), torch.tensor([14, 15])]


@pytest.mark.parametrize("max_len", [64, 1000, 4096])
@pytest.mark.parametrize("num", [1, 2, 3, 8, 16, 128])
def test_longtail_lengths_have_a_mean_at_most_a_quarter_of_the_longest_allowed(num, max_len):
    lengths = longtail_lengths(num, max_len, seed=3)
    assert len(lengths) == num and all(2 <= n <= max_len for n in lengths)
    assert sum(lengths) / num <= max_len / 4
    assert lengths == longtail_lengths(num, max_len, seed=3)
    assert sorted(lengths) == sorted(longtail_lengths(num, max_len, seed=4))  # only the order


def test_longtail_lengths_have_a_long_tail():
    lengths = longtail_lengths(64, 4096)
    assert max(lengths) == 4096 and sorted(lengths)[32] <= 4096 / 6


@pytest.mark.parametrize("max_len", [64, 4096])
@pytest.mark.parametrize("num", [1, 8, 32])
def test_varied_lengths_are_drawn_afresh_each_step_from_the_long_tail(num, max_len):
    steps = [varied_lengths(num, max_len, seed=3, step=k) for k in range(2000)]
    assert all(len(s) == num and all(2 <= n <= max_len for n in s) for s in steps)
    # the same (seed, step), the same lengths; another seed, others
    assert steps[5] == varied_lengths(num, max_len, seed=3, step=5)
    assert steps[5] != varied_lengths(num, max_len, seed=4, step=5)
    assert len({max(s) for s in steps}) > 10  # the padded width changes from step to step
    mean = sum(map(sum, steps)) / (2000 * num)
    assert mean <= max_len / 4
    assert abs(mean * num - varied_mean_tokens(num, max_len)) <= 0.05 * mean * num
    everything = sorted(n for s in steps for n in s)
    assert everything[len(everything) // 2] == pytest.approx(max_len / 8, rel=0.1)  # median
    assert max(everything) == max_len  # the tail reaches the longest allowed


def test_each_varied_step_holds_one_length_from_every_stratum():
    # the k-th shortest length of a step lies between the log-normal's quantiles k/8 and
    # (k+1)/8: one draw per equally likely stratum, so every step spans the distribution
    def at(q: float) -> float:
        if q in (0.0, 1.0):
            return 2 if q == 0.0 else 4096
        return min(4096, math.exp(math.log(4096 / 8) + statistics.NormalDist().inv_cdf(q)))

    for k in range(50):
        ordered = sorted(varied_lengths(8, 4096, seed=0, step=k))
        for i, n in enumerate(ordered):
            assert at(i / 8) - 0.5 <= n <= at((i + 1) / 8) + 0.5, (k, i, n)


def test_flatten_builds_what_data_collator_with_flattening_builds():
    transformers = pytest.importorskip("transformers")
    labels = [s.clone() for s in SEQS]
    labels[2][1] = IGNORE_INDEX  # a target masked on purpose stays masked
    batch = padded(SEQS)
    batch["labels"][2, 1] = IGNORE_INDEX
    ours = flatten(batch)
    theirs = transformers.DataCollatorWithFlattening()(
        [{"input_ids": s.tolist(), "labels": lab.tolist()} for s, lab in zip(SEQS, labels)]
    )
    assert set(ours) == {"input_ids", "labels", "position_ids"}
    for key in ours:
        assert torch.equal(ours[key], theirs[key].long()), key


def test_pack_lays_every_real_token_once_with_positions_restarting():
    batch = padded(SEQS)
    out = pack(batch, row_len=6)
    assert out["input_ids"].shape == (2, 6)  # longest first: [5, 1] and [3, 2] + one filler
    assert out["input_ids"].tolist() == [[9, 10, 11, 12, 13, 8], [5, 6, 7, 14, 15, 0]]
    assert out["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0], [0, 1, 2, 0, 1, 0]]
    assert out["labels"].tolist() == [
        [IGNORE_INDEX, 10, 11, 12, 13, IGNORE_INDEX],
        [IGNORE_INDEX, 6, 7, IGNORE_INDEX, 15, IGNORE_INDEX],
    ]
    assert "attention_mask" not in out


def test_known_lengths_and_left_padding_give_the_same_layouts():
    batch = padded(SEQS)
    lengths = [len(x) for x in SEQS]
    left = {k: torch.stack([torch.cat([r[n:], r[:n]]) for r, n in zip(v, lengths)])
            for k, v in batch.items()}  # each row's padding moved to its left
    assert left["attention_mask"][1].tolist() == [0, 0, 0, 0, 1]
    for layout in (flatten, lambda b, **kw: pack(b, 6, **kw)):
        expected = layout(batch)
        for out in (layout(batch, lengths=lengths), layout(left)):
            assert all(torch.equal(out[k], expected[k]) for k in expected)


def test_pack_defaults_to_the_padded_width_and_never_splits_a_sequence():
    assert pack(padded(SEQS))["input_ids"].shape == (3, 5)
    with pytest.raises(ValueError, match="raise row_len"):
        pack(padded(SEQS), row_len=4)
    assert first_fit_decreasing([3, 1, 5, 2], 6) == [[2, 1], [0, 3]]


def test_pad_to_multiple_pads_on_the_side_the_batch_is_padded_on():
    batch = padded(SEQS)
    out = pad_to_multiple(batch, 4)
    assert out["input_ids"].shape == (4, 8)
    assert out["attention_mask"][:, 5:].sum() == 0 and (out["labels"][:, 5:] == IGNORE_INDEX).all()
    left = {k: v.flip(1) for k, v in batch.items()}
    out = pad_to_multiple(left, 4)
    assert out["attention_mask"][:, :3].sum() == 0 and torch.equal(out["input_ids"][:, 3:], left["input_ids"])
    assert pad_to_multiple(batch, 5) is batch


def test_batches_are_found_through_wrappers():
    import functools

    def step():
        return None

    step.batches = Batches(draw=lambda: padded(SEQS))

    @functools.wraps(step)
    def wrapped():
        return step()

    del wrapped.__dict__["batches"]  # a wrapper that copies nothing still has __wrapped__
    assert batches_of(wrapped) is step.batches and batches_of(lambda: None) is None
    step.batches.transforms.append(("packing", pack))
    assert step.batches.layout == "packing" and "position_ids" in step.batches.next()
