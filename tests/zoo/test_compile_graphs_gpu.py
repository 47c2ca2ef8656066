"""compile-model's CUDA graphs without inductor (backend=cudagraphs) on a GPU: a convnet that
trains its BatchNorm statistics is replayed as graphs, not skipped, and keeps eager's numbers;
so does channels-last, alone and under those graphs, its activations in NHWC; and the forms
tune adds to whole-model compile (reduce-overhead on an MoE, inductor's autotuning) train with
eager's losses."""

from __future__ import annotations

import pytest
import torch

import levers
from levers.workloads import zoo

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def _losses(lever: str | None, steps: int = 4, seen: list | None = None
            ) -> tuple[list[float], torch.Tensor]:
    torch._dynamo.reset()
    torch.manual_seed(0)
    workload = zoo.build(model="resnet", size="tiny", device="cuda")
    handle = levers.apply(workload, lever) if lever else None
    last = [m for m in workload.model.modules() if isinstance(m, torch.nn.Conv2d)][-1]
    hook = None if seen is None else last.register_forward_hook(
        lambda module, args, out: seen.append(out.is_contiguous(memory_format=torch.channels_last)))
    losses = [float(workload.step()) for _ in range(steps)]
    if hook is not None:
        hook.remove()
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


@pytest.mark.parametrize("lever", ["channels-last", "channels-last,compile-model:backend=cudagraphs"])
def test_channels_last_keeps_eager_s_numbers_with_nhwc_activations(lever):
    from torch._dynamo.utils import counters

    eager, eager_running = _losses(None)
    counters.clear()
    # a hook inside a compiled model would be traced into its program: eager only
    seen: list[bool] | None = None if "compile-model" in lever else []
    got, got_running = _losses(lever, seen=seen)
    print(lever, "eager", eager, "got", got, "channels-last outputs", seen)
    assert counters["inductor"]["cudagraph_skips"] == 0
    assert torch.allclose(torch.tensor(got), torch.tensor(eager), rtol=2e-2, atol=1e-3)
    assert torch.allclose(got_running, eager_running, rtol=2e-2, atol=1e-3)
    if seen is not None:
        assert seen and all(seen), "the last convolution's output is not channels-last"


def _trained_losses(model: str, lever: str | None) -> list[float]:
    """Four steps' losses of the zoo's tiny ``model`` with ``lever`` on; the undo, checked, leaves
    the model eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    workload = zoo.build(model=model, size="tiny", device="cuda")
    handle = levers.apply(workload, lever) if lever else None
    out = [float(workload.step()) for _ in range(4)]
    if handle is not None:
        handle.undo()
        assert not any("_compiled_call_impl" in vars(m) for m in workload.model.modules())
    return out


def test_reduce_overhead_compile_trains_a_mixture_of_experts_with_eager_s_numbers():
    """compile-model's mode=auto keeps an MoE off CUDA graphs, but reduce-overhead asked by name
    applies (tune tries it beside compile-model there): the steps run, the losses follow eager's
    within compile's numerics, and the undo leaves the model eager."""
    eager = _trained_losses("mixtral", None)
    graphed = _trained_losses("mixtral", "compile-model:mode=reduce-overhead")
    print("eager", eager, "reduce-overhead", graphed)
    assert all(torch.isfinite(torch.tensor(graphed)))
    assert torch.allclose(torch.tensor(graphed), torch.tensor(eager), rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("form", ["compile-model:mode=max-autotune",
                                  "compile-blocks:mode=max-autotune-no-cudagraphs"])
@pytest.mark.parametrize("model", ["gpt2", "mixtral"])
def test_the_autotuned_form_trains_with_eager_s_numbers(model, form, capfd):
    """The compile group's last forms at the default budget (tune's LATE_FORMS): inductor's
    autotuned whole-model compile under CUDA graphs, on a static step and on an MoE (whose
    routing the graphs skip), and its autotuned per-block compile without them, train with
    eager's losses, and the undo leaves the model eager; inductor's autotuning tables stay off
    the terminal while the lever compiles (an H100 wrote ~300 lines of them for BERT)."""
    eager = _trained_losses(model, None)
    capfd.readouterr()
    tuned = _trained_losses(model, form)
    printed = capfd.readouterr()
    assert "AUTOTUNE" not in printed.err and "Autotune Choices Stats" not in printed.err
    assert "Ignoring this choice" not in printed.err
    print(model, "eager", eager, form, tuned)
    assert all(torch.isfinite(torch.tensor(tuned)))
    assert torch.allclose(torch.tensor(tuned), torch.tensor(eager), rtol=2e-2, atol=1e-3)
