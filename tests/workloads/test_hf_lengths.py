"""The hf workload's variable-length data (lengths=longtail) and its refusals."""

from __future__ import annotations

import pytest

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
