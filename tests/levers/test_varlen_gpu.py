"""The data levers on a GPU at tiny sizes: sdpa's document mask and FlexAttention's BlockMask
(which has no backward on a CPU) keep a packed step's loss and gradients at the padded step's.

Run on the device machine: ``python -m pytest -m gpu tests/levers/test_varlen_gpu.py``. The hf
workload autocasts to bf16 on a GPU, so the tolerance is bf16's; a planted packing without
restarted positions is far outside it.
"""

from __future__ import annotations

import pytest
import torch

import levers
from levers.batches import pack

from lever_parity import assert_close, relative, run_steps

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
pytest.importorskip("transformers")
from levers.workloads import hf  # noqa: E402

BF16 = 3e-2


def varlen(attn):
    return hf.build(lengths="longtail", batch_size=8, seq_len=256, attn=attn, device="cuda")


@pytest.mark.parametrize("lever_id", ["packing", "padding-free"])
@pytest.mark.parametrize("attn", ["sdpa", "flex_attention"])
def test_the_lever_keeps_the_padded_step_on_a_gpu(lever_id, attn):
    padded = run_steps(varlen(attn))
    candidate = varlen(attn)
    levers.apply(candidate, lever_id)
    assert_close(run_steps(candidate), padded, BF16)


@pytest.mark.parametrize("attn", ["sdpa", "flex_attention"])
def test_a_planted_packing_without_restarted_positions_fails_on_a_gpu(attn):
    padded = run_steps(varlen(attn))
    candidate = varlen(attn)

    def wrong(batch):
        out = pack(batch)
        out["position_ids"] = torch.arange(
            out["input_ids"].shape[1], device=out["input_ids"].device
        ).expand_as(out["input_ids"])
        return out

    candidate.step.batches.transforms.append(("packing", wrong))
    changed = run_steps(candidate)
    worst = max(relative(changed.grads[0][n], padded.grads[0][n]) for n in padded.grads[0])
    assert worst > 10 * BF16
