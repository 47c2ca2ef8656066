"""compile-blocks and compile-model on the zoo's models as shipped: no compile per block.

Compiles are counted with dynamo's own counters (frames it converted), on the ``eager`` backend
so that the CPU suite pays for dynamo's tracing only. A model compiled per block compiles as
many frames as it has blocks; the levers must compile as many at depth 4 as at depth 2.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

pytest.importorskip("transformers")

import levers  # noqa: E402
from levers.levers.lever import NotApplicable  # noqa: E402
from levers.workloads import zoo  # noqa: E402

# swin's blocks differ by stochastic depth (a program each): tested on its own below
MODELS = [name for name in zoo.names(available_only=True) if name != "swin"]
# depth is blocks per stack, or per stage where the repeated blocks are stages (two of them at
# size tiny), whose layers compile-blocks compiles from two layers a stage on
DEPTHS = {"resnet": (2, 4), "convnext": (2, 4)}


def frames_compiled(name: str, lever: str, layers: int) -> int:
    torch._dynamo.reset()
    counters.clear()
    workload = zoo.build(model=name, layers=layers)
    with levers.apply(workload, lever, backend="eager"):
        for _ in range(2):
            workload.step()
    limit_hit = [msg for msg in counters["unimplemented"] if "recompile limit" in msg]
    assert not limit_hit, limit_hit
    return counters["frames"]["ok"]


@pytest.mark.parametrize("name", MODELS)
def test_compile_blocks_compiles_once_per_kind_of_block_not_per_block(name):
    shallow, deep = DEPTHS.get(name, (2, 4))
    assert frames_compiled(name, "compile-blocks", deep) == frames_compiled(
        name, "compile-blocks", shallow
    )


def test_stages_compile_their_layers_not_the_whole_stage():
    from levers.levers._compile_setup import compile_units

    model = zoo.build(model="convnext", layers=2).model
    units = compile_units(model)
    assert {type(unit).__name__ for unit in units} == {"ConvNextLayer"}
    assert len(units) == 4  # two stages of two layers
    one_layer_stages = compile_units(zoo.build(model="convnext", layers=1).model)
    assert {type(unit).__name__ for unit in one_layer_stages} == {"ConvNextStage"}


def test_blocks_that_differ_by_stochastic_depth_compile_one_program_each_up_to_the_limit():
    """Swin's drop_path rate grows block by block (and the first block has an Identity in its
    place): dynamo guards both, so every layer is a program of its own, as counted beforehand."""
    from levers.levers import compile_blocks
    from levers.levers._compile_setup import block_programs, compile_units, recompile_limit
    from levers.levers.lever import Target

    workload = zoo.build(model="swin", layers=2)
    programs, differing = block_programs(compile_units(workload.model))
    assert (programs, differing) == (4, ["drop_path (type)", "drop_path.drop_prob"])
    assert frames_compiled("swin", "compile-blocks", 2) == programs
    deep = zoo.build(model="swin", layers=5).model  # 10 layers: 10 programs, past the limit of 8
    assert recompile_limit() == 8
    reason = compile_blocks.applies(Target(model=deep))
    assert reason is not None
    assert "drop_path.drop_prob" in reason and "10 programs" in reason and "compile-model" in reason
    with pytest.raises(NotApplicable, match="stochastic depth"):
        levers.apply(zoo.build(model="swin", layers=5), "compile-blocks")


class _ConvBlock(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(width, width + 1, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(width + 1)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


class _TwoConvBlock(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.first, self.second = _ConvBlock(width), _ConvBlock(width + 1)
        self.back = torch.nn.Conv2d(width + 2, width, 1)

    def forward(self, x):
        return x + self.back(self.second(self.first(x)))


def test_blocks_of_one_class_in_many_widths_are_refused_with_the_widths_named():
    """A pipeline of single convolutions in 10 widths (timm's inception_v4: 91 ConvNormActs in
    20 shapes) and of two-convolution blocks in 10 widths, no attribute differing: the refusal
    names the classes and widths, not an empty attribute, and says what leaving eager the
    single layers would (not) bring."""
    from levers.levers import compile_blocks
    from levers.levers.lever import Target

    model = torch.nn.Sequential(*[_ConvBlock(width) for width in range(1, 11)])
    reason = compile_blocks.applies(Target(model=model))
    assert reason is not None
    assert "the 10 blocks are of 1 class, _ConvBlock in 10 shapes" in reason
    assert "10 programs" in reason and "compile-model" in reason and "differ in  " not in reason
    assert "each a single convolution or linear layer" in reason
    model = torch.nn.Sequential(*[_TwoConvBlock(width) for width in range(1, 11)])
    reason = compile_blocks.applies(Target(model=model))
    assert reason is not None and "_TwoConvBlock in 10 shapes" in reason
    assert "single convolution" not in reason  # none of them is one


class _InceptionLike(torch.nn.Module):
    """timm's inception_resnet_v2 in miniature: repeated blocks (its Block35s) after a branch of
    single ConvNormActs in as many widths (its mixed_5b's): 10 programs compiled one by one, past
    dynamo's limit of 8."""

    def __init__(self) -> None:
        super().__init__()
        self.branch = torch.nn.Sequential(*[_ConvBlock(width) for width in range(3, 12)])
        self.repeat = torch.nn.Sequential(*[_TwoConvBlock(12) for _ in range(4)])

    def forward(self, x):
        return self.repeat(self.branch(x)).mean()


def test_single_layers_past_the_limit_stay_eager_and_the_blocks_compile():
    from levers.levers import compile_blocks
    from levers.levers._compile_setup import block_programs, compile_units, is_compiled
    from levers.levers.lever import Target

    torch.manual_seed(0)
    model = _InceptionLike()
    units = compile_units(model)
    assert block_programs(units)[0] == 10 and compile_blocks.applies(Target(model=model)) is None
    x = torch.randn(2, 3, 6, 6)
    expected = torch.autograd.grad(model(x), list(model.parameters()))
    torch._dynamo.reset()
    counters.clear()
    with levers.apply(model, "compile-blocks", backend="eager") as handle:
        compiled = [is_compiled(unit) for unit in units]
        got = torch.autograd.grad(model(x), list(model.parameters()))
        assert handle._undos[0].__defaults__[0].left_eager == 9
    assert compiled == [False] * 9 + [True] * 4  # the two-convolution blocks only
    assert counters["frames"]["ok"] == 1  # one program, shared by the four blocks
    assert all(torch.equal(a, b) for a, b in zip(expected, got))
    assert not any(is_compiled(unit) for unit in units)


def test_gpt2_as_shipped_compiles_its_blocks_once_and_gets_its_cache_back():
    # issue 20: 12 blocks hit the recompile limit (8) through the KV cache's layer_idx
    torch._dynamo.reset()
    counters.clear()
    workload = zoo.build(model="gpt2", layers=12)
    assert workload.model.config.use_cache is True
    handle = levers.apply(workload, "compile-blocks", backend="eager")
    assert workload.model.config.use_cache is False
    workload.step()
    assert counters["frames"]["ok"] == 1
    assert not counters["unimplemented"]
    handle.undo()
    assert workload.model.config.use_cache is True


def test_integer_block_attributes_are_not_specialised_per_block():
    class Block(torch.nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)
            self.layer_idx = index

        def forward(self, x):
            return self.linear(x) / float(self.layer_idx + 1)

    torch._dynamo.reset()
    counters.clear()
    model = torch.nn.Sequential(*(Block(i) for i in range(6)))
    before = torch._dynamo.config.allow_unspec_int_on_nn_module
    with levers.apply(model, "compile-blocks", backend="eager"):
        model(torch.randn(2, 4)).sum().backward()
    # the first block specialised, the second symbolic, the other four reuse it (6 without)
    assert counters["frames"]["ok"] == 2
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is before


# not gpt2: transformers logs a warning once per process from its forward, a graph break only
# the first time, so its frame count depends on what ran before in the process
@pytest.mark.parametrize("name", ("vit", "nanogpt", "llama"))
def test_compile_model_compiles_the_model_once(name):
    assert frames_compiled(name, "compile-model", 4) == frames_compiled(name, "compile-model", 2)


def test_compile_model_picks_its_mode_and_says_why():
    workload = zoo.build(model="vit")
    with pytest.raises(NotApplicable, match="CUDA graphs need the parameters on a GPU; they are on cpu"):
        levers.apply(workload, "compile-model", mode="reduce-overhead")
    handle = levers.apply(workload, "compile-model", backend="eager")  # mode=auto
    chosen = handle._undos[0]  # the lever's undo carries what it chose
    assert "on cpu" in " ".join(chosen.__defaults__[0].reasons)
    assert chosen.__defaults__[0].mode == "default"
    handle.undo()
    with pytest.raises(NotApplicable, match="CUDA graphs need the parameters on a GPU"):
        levers.apply(zoo.build(model="mixtral"), "compile-model", mode="reduce-overhead")
    with pytest.raises(ValueError, match="mode='fast' is not one of auto"):
        levers.apply(workload, "compile-model", mode="fast")


def test_on_a_mixture_of_experts_auto_picks_the_default_mode_and_tune_tries_reduce_overhead(
    monkeypatch, graph_marks, compile_calls,
):
    """An MoE's routing keeps mode=auto off CUDA graphs, but reduce-overhead asked by name
    applies (inductor's graphs skip what they cannot capture: 1.77x against the default mode's
    1.68x on the zoo's mixtral, H100 s51), and tune tries it beside compile-model; where the
    parameters are on no GPU, neither."""
    from levers.levers import compile_model
    from levers.tune.run import lever_forms

    workload = zoo.build(model="mixtral", layers=1)
    assert lever_forms(workload.model, on_gpu=True) == {}  # CPU parameters: no graphs at all
    # the parameters as on a GPU
    monkeypatch.setattr(compile_model, "graph_blockers", lambda model: [])
    assert lever_forms(workload.model, on_gpu=True) == {
        "compile-model": ("compile-model:mode=reduce-overhead",)}
    # a static step: inductor's default mode beside the CUDA graphs, and two fallbacks (the
    # blocks' programs under graphs, the step's own kernels as graphs)
    assert lever_forms(zoo.build(model="gpt2", layers=1).model, on_gpu=True) == {
        "compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs"),
        "compile-blocks": ("compile-blocks:mode=reduce-overhead",)}
    # at the default budget or more, each compile lever's autotuned form last (the whole
    # model's CUDA graphs, as reduce-overhead's, skip what they cannot capture on an MoE; the
    # blocks' run without graphs)
    blocks = {"compile-blocks": ("compile-blocks:mode=max-autotune-no-cudagraphs",)}
    assert lever_forms(workload.model, on_gpu=True, budget_s=600.0) == {
        "compile-model": ("compile-model:mode=reduce-overhead",
                          "compile-model:mode=max-autotune"), **blocks}
    assert lever_forms(zoo.build(model="gpt2", layers=1).model, on_gpu=True, budget_s=600.0) == {
        "compile-model": ("compile-model:mode=default", "compile-model:backend=cudagraphs",
                          "compile-model:mode=max-autotune"),
        "compile-blocks": ("compile-blocks:mode=reduce-overhead",
                           "compile-blocks:mode=max-autotune-no-cudagraphs")}
    assert lever_forms(workload.model, on_gpu=True, budget_s=599.0) == {
        "compile-model": ("compile-model:mode=reduce-overhead",)}
    with pytest.raises(NotApplicable, match="backend=cudagraphs replays CUDA graphs, but "
                       "model.layers.0.mlp.experts is a mixture of experts"):
        levers.apply(workload, "compile-model", backend="cudagraphs")
    torch._dynamo.reset()
    for mode, chosen in (("auto", "default"), ("reduce-overhead", "reduce-overhead")):
        handle = levers.apply(workload, "compile-model", mode=mode, backend="eager")
        assert handle._undos[0].__defaults__[0].mode == chosen
        handle.undo()
    assert compile_calls == [{"backend": "eager"},
                             {"backend": "eager", "mode": "reduce-overhead"}]


def test_compile_model_with_cuda_graphs_marks_each_step_and_its_undo_restores_everything(
    monkeypatch, graph_marks,
):
    from levers.levers import compile_model

    # a static step as compile-model sees it on a GPU; on the eager backend the mode is only
    # recorded, so the step wrapping and the undo run on a CPU
    monkeypatch.setattr(compile_model, "static_step_reasons", lambda model: [])
    torch._dynamo.reset()
    workload = zoo.build(model="gpt2", layers=2)
    step, forward = workload.step, workload.model.forward
    flag = torch._dynamo.config.allow_unspec_int_on_nn_module
    handle = levers.apply(workload, "compile-model", backend="eager")  # mode=auto
    chosen = handle._undos[0].__defaults__[0]
    assert (chosen.mode, chosen.reasons) == ("reduce-overhead", [])
    assert workload.step is not step and workload.model.config.use_cache is False
    assert torch.isfinite(workload.step())
    assert graph_marks == [1]
    handle.undo()
    assert workload.step is step and workload.model.forward == forward
    assert "_compiled_call_impl" not in vars(workload.model)
    assert workload.model.config.use_cache is True
    assert torch._dynamo.config.allow_unspec_int_on_nn_module is flag
    workload.step()
    assert graph_marks == [1]


def test_compile_model_s_cuda_graphs_without_inductor_form(monkeypatch, graph_marks,
                                                          compile_calls):
    from levers.levers import compile_model

    workload = zoo.build(model="gpt2", layers=2)
    with pytest.raises(NotApplicable, match="backend=cudagraphs replays CUDA graphs, but CUDA "
                       "graphs need the parameters on a GPU"):
        levers.apply(workload, "compile-model", backend="cudagraphs")
    with pytest.raises(ValueError, match="mode=default is inductor's; backend=cudagraphs takes"):
        levers.apply(workload, "compile-model", backend="cudagraphs", mode="default")
    # a static step as compile-model sees it on a GPU: torch.compile is asked for the
    # cudagraphs backend and no inductor mode, and each step is marked as a graph's step (on
    # a CPU the backend itself runs the traced program without graphs)
    monkeypatch.setattr(compile_model, "static_step_reasons", lambda model: [])
    torch._dynamo.reset()
    step = workload.step
    handle = levers.apply(workload, "compile-model", backend="cudagraphs")
    assert compile_calls == [{"backend": "cudagraphs"}]
    assert handle._undos[0].__defaults__[0].mode == "cudagraphs"
    assert torch.isfinite(workload.step()) and graph_marks == [1]
    handle.undo()
    assert workload.step is step and "_compiled_call_impl" not in vars(workload.model)


def test_the_two_compile_levers_refuse_each_other():
    workload = zoo.build(model="llama")
    with levers.apply(workload, "compile-blocks", backend="eager"):
        with pytest.raises(NotApplicable, match="compile-blocks"):
            levers.apply(workload, "compile-model")
    with levers.apply(workload, "compile-model", backend="eager"):
        with pytest.raises(NotApplicable, match="compile-model"):
            levers.apply(workload, "compile-blocks")


@pytest.mark.parametrize(("name", "static"), [("swin", True), ("convnext", True), ("llama", False)])
def test_stages_of_different_widths_compile_static_and_blocks_of_one_shape_do_not(name, static):
    """A Swin's stages differ in width: traced with automatic dynamic shapes after the first,
    its window arithmetic took dynamo 90 s for one step of the tiny model on a CPU (5 s static)."""
    from levers.levers import compile_blocks
    from levers.levers.lever import target_of

    torch._dynamo.reset()
    workload = zoo.build(model=name)
    undo = compile_blocks.patch(target_of(workload, {"backend": "eager"}))
    try:
        assert undo.dynamic is (False if static else None)
        workload.step()
    finally:
        undo()


def test_blocks_that_need_a_program_each_are_all_compiled_and_the_limit_comes_back():
    """Blocks can differ in what no attribute shows (a ConvNeXt stage's first layer takes bf16
    under autocast, the rest fp32): past dynamo's recompile limit the later blocks would run
    uncompiled, so the lever raises the limit to the number of blocks while it is on."""
    from levers.levers._compile_setup import recompile_limit

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.linear(x).relu()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList(Block() for _ in range(10))

        def forward(self, x):
            for i, block in enumerate(self.blocks):
                x = torch.cat([block(x[: i + 1]), x[i + 1 :]])  # block i sees i + 1 rows
            return x

    torch._dynamo.reset()
    counters.clear()
    model = Model()
    before = recompile_limit()
    with levers.apply(model, "compile-blocks", backend="eager", dynamic=False):
        assert recompile_limit() == 11
        model(torch.randn(12, 4)).sum().backward()
    assert recompile_limit() == before
    assert not [m for m in counters["unimplemented"] if "recompile limit" in m]
    assert counters["frames"]["ok"] == 10  # one program a block, none left uncompiled
