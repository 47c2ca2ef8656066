"""ATTN002's freed memory from the memory model: the eager-to-SDPA what-if, predicted by levers
memory for the audit's GPU, and the estimate (labelled as one) when it cannot be predicted."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from levers.cli import main  # noqa: E402
from levers.audit.config import DEFAULT_TARGET  # noqa: E402
from levers.hardware import resolve_gpu  # noqa: E402
from levers.memory import predict_memory  # noqa: E402

QUICK = ["--warmup", "0", "--timed", "1"]
HF_EAGER = {"arch": "qwen2", "attn": "eager", "size": "tiny"}


def attn002(capsys, tmp_path, *extra: str) -> dict:
    out = tmp_path / "findings.json"
    sets = [f"{k}={v}" for k, v in HF_EAGER.items()]
    code = main(
        ["audit", "hf", "--set", *sets, "--select", "ATTN002", "--findings-json", str(out)]
        + QUICK
        + list(extra)
    )
    capsys.readouterr()
    assert code == 0
    findings = json.loads(out.read_text())["findings"]
    (finding,) = [f for f in findings if f["code"] == "ATTN002"]
    return finding


@pytest.mark.slow
def test_freed_memory_is_the_drop_of_the_predicted_peak(capsys, tmp_path):
    finding = attn002(capsys, tmp_path)
    # a CPU capture is predicted on the default target's largest-memory part
    gpu = resolve_gpu(DEFAULT_TARGET, allow_budget=False).name
    assert gpu == "h100-80gb"
    eager = predict_memory("hf", gpu, params=HF_EAGER, whatifs=True)
    sdpa = predict_memory("hf", gpu, params={**HF_EAGER, "attn": "sdpa"})
    (whatif,) = [w for w in eager.whatifs if w.name == "sdpa-attention"]
    assert whatif.applicable
    # switching the built model's attention predicts the same step as building it with SDPA
    assert whatif.peak_allocated_bytes == sdpa.peak_allocated_bytes
    freed = eager.peak_allocated_bytes - sdpa.peak_allocated_bytes
    assert freed > 0
    assert finding["cost"]["saved_bytes"] == freed
    assert finding["details"]["freed_bytes_source"] == "levers memory"
    assert "predicted by levers memory for h100-80gb" in finding["message"]


def test_without_the_memory_model_the_estimate_says_so(capsys, tmp_path):
    finding = attn002(capsys, tmp_path, "--no-memory-model")
    assert finding["details"]["freed_bytes_source"] == "score shapes"
    assert "estimated from the fp32 probabilities kept for backward" in finding["message"]
    assert "no memory-model prediction" in finding["message"]
