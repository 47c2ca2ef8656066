"""levers.hardware: one table, and every GPU name accepted by every verb."""

from __future__ import annotations

import pytest

from levers.audit.options import AuditOptions
from levers.audit.config import make_config
from levers.hardware import GPUS, gpu_from_device_name, gpu_names, resolve_gpu

from hand_capture import make_capture


@pytest.mark.parametrize(
    ("text", "part"),
    [
        ("h100", "h100-80gb"),
        ("H100-80GB", "h100-80gb"),
        ("h100-sxm", "h100-80gb"),
        ("h200", "h200"),
        ("a100", "a100-80gb"),
        ("a100-80gb", "a100-80gb"),
        ("a100-40gb", "a100-40gb"),
    ],
)
def test_every_name_resolves_to_its_part(text, part):
    assert resolve_gpu(text) is GPUS[part]
    assert resolve_gpu(text, allow_budget=False, option="--target") is GPUS[part]


def test_every_listed_name_resolves_and_prices():
    for name in gpu_names():
        spec = resolve_gpu(name, allow_budget=False)
        assert spec.has_compute_figures and spec.usable_bytes > 0


def test_a_budget_is_for_the_memory_model_only():
    assert resolve_gpu("40GiB").total_bytes == (40 << 30) + (600 << 20)
    with pytest.raises(ValueError, match=r"--target '40GiB' is not known; use one of: h100-80gb"):
        resolve_gpu("40GiB", allow_budget=False, option="--target")


def test_the_audit_takes_the_memory_models_names():
    config = make_config(make_capture(), AuditOptions.checked(gpu="h100-80gb"))
    assert config.gpu is GPUS["h100-80gb"] and config.gpu.family == "h100"
    config = make_config(make_capture(), AuditOptions.checked(gpu="a100"))
    assert config.gpu.title == "NVIDIA A100 SXM"


def test_device_names():
    assert gpu_from_device_name("NVIDIA H200") is GPUS["h200"]
    assert gpu_from_device_name("NVIDIA A100-SXM4-40GB") is GPUS["a100-40gb"]
    assert gpu_from_device_name("Tesla T4") is None
