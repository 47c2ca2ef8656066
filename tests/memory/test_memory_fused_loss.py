"""fused-linear-cross-entropy in a memory prediction: Liger's kernel predicted by the tensors it
makes (its gradient buffers and one chunk of logits at a time), never the full logits."""

from __future__ import annotations

import pytest

from levers.hardware import resolve_gpu
from levers.levers.handle import apply_to_workload
from levers.memory.prediction import run_prediction, source_of

pytest.importorskip("transformers")

H200 = resolve_gpu("h200")
PARAMS = {"arch": "llama", "size": "tiny", "batch_size": 4, "seq_len": 64}


def _predict(kernel: str):
    def fused_loss(workload) -> None:
        handle = apply_to_workload(workload, ["fused-linear-cross-entropy"], quiet=True,
                                   kernel=kernel)
        assert handle.applied == ["fused-linear-cross-entropy"], handle.skipped

    return run_prediction(source_of("hf", PARAMS), H200, num_steps=2, transform=fused_loss)


@pytest.fixture(scope="module")
def liger():
    return _predict("liger")


def _loss_allocations(prediction, vocab: int, step: int = 1) -> dict[str, list]:
    """The step's allocations by what they are: matmul outputs onto the vocabulary (logits),
    and zero-filled buffers (Liger's gradient buffers)."""
    allocations = [a for a in prediction.trace.allocations if a.step == step]
    return {
        "logits": [a for a in allocations if a.op == "aten.mm.default" and a.shape[-1] == vocab],
        "zeros": [(a.phase, a.shape) for a in allocations if a.op == "aten.zeros_like.default"],
    }


def _sizes():
    from levers.loader import load_workload

    model = load_workload("hf", {**PARAMS, "device": "cpu"}).model
    vocab, width = model.lm_head.weight.shape
    return vocab, width, PARAMS["batch_size"] * PARAMS["seq_len"]  # labels shifted and padded


def test_liger_is_predicted_by_its_gradient_buffers_and_chunks(liger):
    vocab, width, rows = _sizes()
    # Liger's chunk: next_pow2(ceil(rows / ceil(vocab / width))) rows of logits
    per_chunk = -(-rows // -(-vocab // width))
    chunk = 1 << (per_chunk - 1).bit_length()
    found = _loss_allocations(liger, vocab)
    # its gradients are computed in the forward, into buffers kept for backward
    assert ("forward", (rows, width)) in found["zeros"]
    assert ("forward", (vocab, width)) in found["zeros"]
    assert {a.shape for a in found["logits"]} == {(chunk, vocab)}
    assert len(found["logits"]) == -(-rows // chunk)  # one per chunk, never the full logits


def test_the_chunked_kernel_takes_its_gradients_in_backward():
    from levers.levers._lce import DEFAULT_CHUNK_ROWS

    vocab, width, rows = _sizes()
    found = _loss_allocations(_predict("chunked"), vocab)
    assert not found["zeros"]  # no gradient buffer made in the forward
    chunk = min(DEFAULT_CHUNK_ROWS, rows)
    # each chunk's logits in the forward and again when backward recomputes it
    assert {a.shape for a in found["logits"]} == {(chunk, vocab)}
    assert {a.phase for a in found["logits"]} == {"forward", "backward"}
