"""Datasheet ceilings of the GPUs levers estimates for.

Dense (no structured sparsity) tensor-core peaks and HBM bandwidth, from NVIDIA's datasheets
for the SXM parts: H100 SXM5 80GB, H200 SXM 141GB, A100 SXM4 80GB. FP32 is the non-tensor-core
rate; TF32 is the dense tensor-core rate for fp32 matmuls when TF32 is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    name: str  # "h100"
    title: str  # "NVIDIA H100 SXM"
    sm: tuple[int, int]  # compute capability
    bf16_tflops: float  # dense
    fp16_tflops: float  # dense
    tf32_tflops: float  # dense
    fp32_tflops: float  # non-tensor-core
    hbm_gbps: float  # GB/s, decimal

    def peak_flops(self, dtype: str, *, tf32: bool = False) -> float:
        """FLOP/s of a matmul in ``dtype`` (float32 uses TF32 tensor cores when allowed)."""
        if dtype == "bfloat16":
            return self.bf16_tflops * 1e12
        if dtype == "float16":
            return self.fp16_tflops * 1e12
        if dtype == "float32" and tf32:
            return self.tf32_tflops * 1e12
        return self.fp32_tflops * 1e12

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return self.hbm_gbps * 1e9


GPUS = {
    "h100": GpuSpec(
        name="h100",
        title="NVIDIA H100 SXM",
        sm=(9, 0),
        bf16_tflops=989.4,
        fp16_tflops=989.4,
        tf32_tflops=494.7,
        fp32_tflops=66.9,
        hbm_gbps=3350.0,
    ),
    "h200": GpuSpec(
        name="h200",
        title="NVIDIA H200 SXM",
        sm=(9, 0),
        bf16_tflops=989.4,
        fp16_tflops=989.4,
        tf32_tflops=494.7,
        fp32_tflops=66.9,
        hbm_gbps=4800.0,
    ),
    "a100": GpuSpec(
        name="a100",
        title="NVIDIA A100 SXM",
        sm=(8, 0),
        bf16_tflops=312.0,
        fp16_tflops=312.0,
        tf32_tflops=156.0,
        fp32_tflops=19.5,
        hbm_gbps=2039.0,
    ),
}


def spec_for_device_name(device_name: str) -> GpuSpec | None:
    """The spec of a GPU from its CUDA device name ("NVIDIA H200" -> h200), or None."""
    lowered = device_name.lower()
    for key in ("h200", "h100", "a100"):
        if key in lowered:
            return GPUS[key]
    return None
