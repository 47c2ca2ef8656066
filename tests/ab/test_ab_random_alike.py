"""Random numbers drawn alike while parity is judged: a compiled dropout takes eager's masks.

inductor on the CPU compiles through a C++ compiler; these tests compile two tiny programs.
"""

from __future__ import annotations

import shutil

import pytest
import torch

from levers import Workload
from levers.ab.random_alike import Compiled, drawn_alike, recompile_for_timing
from levers.ab.reference import run_reference
from levers.ab.runner import AbConfig, Side, run_ab

needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None,
    reason="inductor on the CPU needs a C++ compiler",
)


class _Net(torch.nn.Sequential):
    # a forward of this file's own: dynamo does not trace torch.nn's containers as a top frame,
    # so model.compile() on a plain nn.Sequential compiles nothing
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self[2](self[1](self[0](x)))


def _dropout_workload(
    *, compiled: bool = False, p: float = 0.1, in_place: bool = False
) -> Workload:
    """``in_place``: the model compiled as compile-model compiles it (``model.compile()``)."""
    torch.manual_seed(0)
    model = _Net(
        torch.nn.Linear(16, 16), torch.nn.Dropout(p), torch.nn.Linear(16, 1)
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(32 * 16, dtype=torch.float32).reshape(32, 16) / 512
    forward = model
    if in_place:
        model.compile(backend="inductor")
    elif compiled:
        forward = torch.compile(model, backend="inductor")

    def step():
        loss = forward(x).square().mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(model=model, step=step, optimizer=optimizer)


def _loss_and_grad(workload: Workload) -> tuple[float, torch.Tensor]:
    torch.manual_seed(1)
    loss = workload.model(torch.ones(32, 16)).sum()
    loss.backward()
    grad = workload.model[0].weight.grad.clone()
    workload.model.zero_grad(set_to_none=True)
    return float(loss), grad


@needs_compiler
def test_a_compiled_dropout_takes_the_eager_masks_while_drawn_alike():
    torch._dynamo.reset()
    eager = _dropout_workload()
    compiled = _dropout_workload()
    program = torch.compile(compiled.model, backend="inductor")
    expected = _loss_and_grad(eager)
    import torch._inductor.config as inductor_config

    before = inductor_config.fallback_random
    with drawn_alike() as seen:
        torch.manual_seed(1)
        loss = program(torch.ones(32, 16)).sum()
        loss.backward()
    assert inductor_config.fallback_random == before  # put back
    assert seen.any
    assert float(loss) == expected[0]
    assert torch.equal(compiled.model[0].weight.grad, expected[1])


def test_nothing_compiled_means_nothing_to_recompile():
    assert recompile_for_timing(Compiled(graphs=0), True) is False
    assert recompile_for_timing(Compiled(graphs=2), False) is False


@needs_compiler
def test_programs_compiled_alike_are_dropped_where_the_model_draws():
    torch._dynamo.reset()
    program = torch.compile(torch.nn.Linear(2, 2), backend="inductor")
    with drawn_alike() as seen:
        program(torch.ones(1, 2))
    from torch._dynamo.utils import counters

    assert recompile_for_timing(seen, None) is True  # not known: dropped
    before = counters["stats"]["unique_graphs"]
    program(torch.ones(1, 2))
    assert counters["stats"]["unique_graphs"] == before + 1  # compiled again


@pytest.mark.parametrize("p, drawn", [(0.1, True), (0.0, False)])
def test_the_reference_says_whether_the_model_draws_random_numbers(p, drawn):
    reference, kill = run_reference(lambda: _dropout_workload(p=p), num_steps=2, seed=0)
    assert kill is None and reference.available, reference.why_not
    assert reference.draws_random is drawn


def test_batches_drawn_outside_the_model_are_not_the_models_draws():
    def build():
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

        def step():
            x = torch.randn(8, 4)  # the batch: drawn before the model runs
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss.detach()

        return Workload(model=model, step=step, optimizer=optimizer)

    reference, _ = run_reference(build, num_steps=1, seed=0)
    assert reference.available and reference.draws_random is False


@needs_compiler
def test_an_ab_of_a_compiled_dropout_model_reads_parity_against_eager():
    torch._dynamo.reset()
    result = run_ab(
        Side(build=lambda: _dropout_workload()),
        Side(build=lambda: _dropout_workload(compiled=True)),
        AbConfig(num_steps=2, num_warmup=1, num_parity_steps=3, num_resamples=200),
    )
    assert result.parity is not None
    assert result.parity.passed is True, result.parity.checks


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@needs_compiler
@pytest.mark.parametrize("sides", ["together", "one-at-a-time"])
def test_the_timed_steps_may_run_the_parity_programs_and_say_so(sides):
    # levers tune's A/Bs: one compile of a compiled dropout model, not two, and the result says
    # its timed steps drew random numbers as eager does
    config = dict(num_steps=2, num_warmup=1, num_parity_steps=2, num_resamples=200, sides=sides)
    compiles = {}
    for keep in (False, True):
        torch._dynamo.reset()
        before = _graphs()
        result = run_ab(
            Side(build=lambda: _dropout_workload()),
            Side(build=lambda: _dropout_workload(in_place=True)),
            AbConfig(**config, time_parity_programs=keep),
        )
        assert result.parity.passed is True and result.killed is None
        assert result.timed_eager_random is keep
        compiles[keep] = _graphs() - before
    assert compiles == {False: 2, True: 1}


@needs_compiler
def test_a_model_that_draws_nothing_is_timed_as_run_either_way():
    torch._dynamo.reset()
    result = run_ab(
        Side(build=lambda: _dropout_workload(p=0.0)),
        Side(build=lambda: _dropout_workload(in_place=True, p=0.0)),
        AbConfig(num_steps=2, num_warmup=1, num_parity_steps=2, num_resamples=200,
                 time_parity_programs=True),
    )
    assert result.parity.passed is True
    assert result.timed_eager_random is False


@needs_compiler
@pytest.mark.parametrize("sides", ["together", "one-at-a-time"])
def test_a_side_replaying_inductor_graphs_is_timed_as_run_all_the_same(sides):
    # a program replayed as CUDA graphs, compiled with eager's random draws, does not time as the
    # user's (luke, H100): such a side compiles again for its timed steps where time allows. On
    # the CPU the side's levers name the graphs' form and its build compiles with inductor
    result, compiles = _ab_of_a_graphs_form(sides)
    assert result.parity.passed is True and result.killed is None
    assert result.timed_eager_random is False
    assert compiles == 2  # the parity steps' program, then the user's


@needs_compiler
def test_without_time_for_another_compile_the_parity_programs_are_timed(monkeypatch):
    import levers.ab.runner as runner

    monkeypatch.setattr(runner, "time_left_s", lambda lines: 0.0)
    result, compiles = _ab_of_a_graphs_form("together")
    assert result.parity.passed is True
    assert result.timed_eager_random is True
    assert compiles == 1


@pytest.mark.parametrize("specs, static, replays", [
    (("compile-model:mode=reduce-overhead",), False, True),
    (("compile-model:mode=max-autotune",), False, True),
    (("compile-model",), True, True),  # mode=auto on a static step: CUDA graphs
    (("compile-model",), False, False),
    (("compile-model:mode=default",), True, False),
    (("compile-model:backend=cudagraphs",), True, False),  # eager's kernels, not inductor's
    (("compile-blocks", "float8"), True, False),
    (("float8", "compile-model"), True, True),
    # the blocks' programs as CUDA graphs, asked by name (compile-blocks has no auto mode)
    (("compile-blocks:mode=reduce-overhead",), False, True),
    (("compile-blocks:mode=max-autotune-no-cudagraphs",), True, False),
    (("compile-blocks:mode=reduce-overhead,backend=eager",), True, False),
])
def test_which_stacks_replay_inductor_graphs(monkeypatch, specs, static, replays):
    from levers.levers import compile_model

    monkeypatch.setattr(compile_model, "static_step_reasons",
                        lambda model: [] if static else ["the parameters are on cpu"])
    assert compile_model.replays_inductor_graphs(specs, torch.nn.Linear(2, 2)) is replays


def _ab_of_a_graphs_form(sides: str):
    """tune's A/B of a dropout model under a form that replays inductor's program as CUDA graphs
    (on the CPU: the side's levers name it, its build compiles with inductor); the result and the
    programs compiled."""
    torch._dynamo.reset()
    before = _graphs()
    result = run_ab(
        Side(build=lambda: _dropout_workload()),
        Side(build=lambda: _dropout_workload(in_place=True),
             levers=("compile-model:mode=reduce-overhead",)),
        AbConfig(num_steps=2, num_warmup=1, num_parity_steps=2, num_resamples=200, sides=sides,
                 time_parity_programs=True),
    )
    return result, _graphs() - before
