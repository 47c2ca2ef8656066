"""compile-blocks in a mode that replays its blocks' programs as CUDA graphs
(``mode=reduce-overhead``): the step marks each step's start and returns a copy of its loss, as
compile-model's does, and the undo puts the step back; without the parameters on a GPU it does
not apply."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.workloads import zoo  # noqa: E402


def test_compile_blocks_with_cuda_graphs_needs_the_parameters_on_a_gpu():
    workload = zoo.build(model="gpt2", layers=2)
    with pytest.raises(NotApplicable, match="mode=reduce-overhead replays CUDA graphs, but CUDA "
                       "graphs need the parameters on a GPU; they are on cpu"):
        levers.apply(workload, "compile-blocks", mode="reduce-overhead")
    # inductor's modes without graphs apply on a CPU as before
    with levers.apply(workload, "compile-blocks", mode="max-autotune-no-cudagraphs",
                      backend="eager"):
        pass


def test_compile_blocks_with_cuda_graphs_marks_each_step_and_its_undo_restores_the_step(
    monkeypatch, graph_marks, compile_calls,
):
    from levers.levers import compile_blocks

    # the parameters as on a GPU; on the eager backend the mode is only recorded, so the step
    # wrapping and the undo run on a CPU
    monkeypatch.setattr(compile_blocks, "graph_blockers", lambda model: [])
    torch._dynamo.reset()
    workload = zoo.build(model="gpt2", layers=2)
    step = workload.step
    returned = []
    workload.step = lambda: returned.append(step()) or returned[-1]
    plain = workload.step
    handle = levers.apply(workload, "compile-blocks", mode="reduce-overhead", backend="eager")
    assert compile_calls == [{"mode": "reduce-overhead", "backend": "eager"}] * 2  # one per block
    assert workload.step is not plain
    loss = workload.step()
    assert graph_marks == [1] and torch.isfinite(loss)
    # a copy of the loss: the graph's output buffer is overwritten by the next replay
    assert loss is not returned[-1] and torch.equal(loss, returned[-1])
    handle.undo()
    assert workload.step is plain
    workload.step()
    assert graph_marks == [1]
    # the default mode does not wrap the step
    with levers.apply(workload, "compile-blocks", backend="eager"):
        assert workload.step is plain
