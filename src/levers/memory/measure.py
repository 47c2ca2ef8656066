"""``--measure``: run the real step on this machine's GPU and read the allocator's peaks, to
set beside the prediction.

The workload is built on the GPU and run for the same number of steps as the prediction, so
both peaks cover the same work (the build and every step); ``max_memory_allocated`` and
``max_memory_reserved`` are read at the end.
"""

from __future__ import annotations

import gc

import torch

from levers.errors import LeversError
from levers.memory.plan import Measured
from levers.memory.prediction import Source


def measure_peaks(source: Source, *, num_steps: int) -> Measured:
    """Build and run the workload on the GPU; raises if there is none."""
    if not torch.cuda.is_available():
        raise LeversError(
            "--measure runs the real step and needs a CUDA GPU, which this machine does not "
            "have; drop --measure to get the prediction alone"
        )
    # start from an empty cache: segments left by earlier work in this process would be counted
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    workload = source.built({**source.params, "device": source.params.get("device", "cuda")})
    for _ in range(num_steps):
        workload.step()
    torch.cuda.synchronize()  # sync point: the peaks are final only once the kernels ran
    measured = Measured(
        device_name=torch.cuda.get_device_name(),
        peak_allocated_bytes=torch.cuda.max_memory_allocated(),
        peak_reserved_bytes=torch.cuda.max_memory_reserved(),
        num_steps=num_steps,
        torch_version=torch.__version__,
    )
    del workload
    return measured
