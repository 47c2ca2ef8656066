"""DTYPE002 on the pattern it was written for: a Hugging Face Mixtral (transformers' own experts
code, ``integrations/moe.py``) with fp32 weights trained under bf16 autocast. On a CPU, torch's
``_grouped_mm`` kernel takes transformers' grouped path as a GPU does, and the experts run in
fp32."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from levers.audit.options import AuditOptions
from levers.audit.config import make_config
from levers.audit.rules.registry import all_rules
from levers.capture import capture_step
from levers.workloads.zoo import build

pytest.importorskip("transformers")

# the tiny Mixtral (2 blocks of 4 experts, 2 per token, width 64, ffn 128) at 64 x 32 tokens: its
# 12 grouped matmuls (per block: 2 forward, 4 backward) are 1.21 GFLOP, over the rule's floor
BATCH_SIZE = 64
TOKENS = BATCH_SIZE * 32
# per token and block: 2 experts x (gate_up 2*64*256 + down 2*128*64), forward and two backward
GROUPED_FLOPS = 2 * TOKENS * 2 * (2 * 64 * 256 + 2 * 128 * 64) * 3


@functools.cache
def _capture(autocast: bool):
    workload = build(model="mixtral", batch_size=BATCH_SIZE)
    plain = workload.step

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            return plain()

    return capture_step(dataclasses.replace(workload, step=step), warmup=1, timed=0)


def _findings(code: str, autocast: bool = True, assume_dtype: str | None = None):
    capture = _capture(autocast)
    options = AuditOptions.checked(gpu="h100", torch_version="2.11", assume_dtype=assume_dtype)
    config = make_config(capture, options)
    return list(all_rules()[code].check(capture, config))


def test_fires_on_transformers_experts_in_fp32_under_autocast():
    (finding,) = _findings("DTYPE002")
    assert finding.details["num_grouped_mms"] == 12
    assert finding.details["fp32_grouped_mm_flops"] == GROUPED_FLOPS
    assert finding.details["autocast_dtype"] == "bfloat16"
    assert finding.lever == "grouped-mm-autocast"
    assert finding.receipts[0].file.endswith("transformers/integrations/moe.py")
    assert {r.module for r in finding.receipts} == {"model.layers.*.mlp.experts"}


def test_a_cpu_capture_in_fp32_is_judged_as_its_gpu_run_under_autocast():
    (assumed,) = _findings("DTYPE002", autocast=False)  # the GPU run is assumed bf16 autocast
    assert "would stay fp32 under the GPU run's bf16 autocast (assumed" in assumed.message
    assert assumed.details["fp32_grouped_mm_flops"] == GROUPED_FLOPS
    # declared to run in fp32 on the GPU too: fp32 by choice
    assert _findings("DTYPE002", autocast=False, assume_dtype="fp32") == []
