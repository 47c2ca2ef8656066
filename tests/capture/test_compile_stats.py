"""The compile record of a capture: only what happened after its snapshot, and never an error
raised into the user's optimizer hooks."""

from __future__ import annotations

import gc

import torch

from levers.capture import compile_stats
from levers.integrations.steps import StepWatcher


def _recompile_twice(ks=(1, 2, 3)) -> None:
    def scaled(x, k):
        return x * k

    fn = torch.compile(scaled, backend="eager", dynamic=False)
    for k in ks:
        fn(torch.ones(2), k)


def test_a_watcher_leaves_out_what_compiled_before_it():
    torch._dynamo.reset()
    _recompile_twice()
    assert compile_stats.since(compile_stats.Snapshot()) is not None  # the process saw it
    watcher = StepWatcher(warmup=1)
    assert compile_stats.since(watcher.compiled_before) is None


def test_freed_code_objects_do_not_break_a_snapshot():
    torch._dynamo.reset()
    _recompile_twice()
    before = compile_stats.snapshot()
    gc.collect()  # the compiled function is gone
    _recompile_twice(ks=(4, 5))
    stats = compile_stats.since(before)
    assert stats is not None and stats["frames_compiled"] >= 1
    assert isinstance(compile_stats.snapshot(), compile_stats.Snapshot)


def test_the_model_is_found_beside_a_dead_weak_proxy():
    import weakref

    from levers.integrations.steps import find_model

    class Holder:
        pass

    held = Holder()
    proxy = weakref.proxy(held)
    del held  # the proxy now raises ReferenceError on any attribute, isinstance included
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    assert find_model(optimizer) is model
    assert proxy is not None
