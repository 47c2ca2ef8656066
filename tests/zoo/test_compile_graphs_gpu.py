"""compile-model's CUDA graphs without inductor (backend=cudagraphs) on a GPU: a convnet that
trains its BatchNorm statistics is replayed as graphs, not skipped, and keeps eager's numbers."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.workloads import zoo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _losses(lever: str | None, steps: int = 4) -> tuple[list[float], torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    workload = zoo.build(model="resnet", size="tiny", device="cuda")
    handle = levers.apply(workload, lever) if lever else None
    losses = [float(workload.step()) for _ in range(steps)]
    stats = next(m for m in workload.model.modules() if isinstance(m, torch.nn.BatchNorm2d))
    running = stats.running_mean.detach().clone()
    if handle is not None:
        handle.undo()
    return losses, running


def test_the_cuda_graph_form_replays_a_batchnorm_convnet_with_eager_s_numbers():
    from torch._dynamo.utils import counters

    eager, eager_running = _losses(None)
    counters.clear()
    graphed, graphed_running = _losses("compile-model:backend=cudagraphs")
    print("eager", eager, "graphs", graphed, "counters", dict(counters["inductor"]))
    assert counters["inductor"]["cudagraph_skips"] == 0, "the backend skipped its CUDA graphs"
    assert torch.allclose(torch.tensor(graphed), torch.tensor(eager), rtol=2e-2, atol=1e-3)
    # the BatchNorm statistics move in the graphs as they do eagerly (a replay that dropped
    # their update would leave them where the first capture left them)
    assert torch.allclose(graphed_running, eager_running, rtol=2e-2, atol=1e-3)
