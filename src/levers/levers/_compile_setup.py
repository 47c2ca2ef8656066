"""What both compile levers (compile-blocks, compile-model) set up around ``torch.compile`` so
that a model as shipped compiles once, not once per block; each returns its undo.

- The KV cache off while training. A Hugging Face config keeps ``use_cache=True`` (it is the
  generation default), and in training mode transformers 5 then builds a ``DynamicCache`` on
  every forward: the cache layer each block updates is picked by the block's ``layer_idx``
  (``cache.layers[self.layer_idx]``) and its ``is_initialized`` flag differs per layer, so every
  block's guards fail for the next block and dynamo recompiles the block per layer until
  ``recompile_limit`` (8): the blocks after the 8th run uncompiled (issue 20, GPT-2 at 12 layers).
  A training step never reads the cache back, so it is wasted memory as well. This is what Hugging
  Face's own ``gradient_checkpointing_enable()`` does in training (``use_cache = False``).
- Integer module attributes unspecialised. Dynamo guards an ``int`` attribute that a forward
  reads (``self.layer_idx`` in a scale, an index) by its value, so blocks that differ only in it
  compile once each. ``torch._dynamo.config.allow_unspec_int_on_nn_module`` (torch >= 2.4; on
  torch 2.11 and 2.13 it defaults to False) traces such ints as symbolic inputs instead: the
  first block compiles specialised, the second once more with the int symbolic, and every later
  block reuses that graph (checked: 2 graphs for 6 blocks reading their index, 6 without it).
  ``inline_inbuilt_nn_modules`` (the default since torch 2.5) already makes the parameters
  graph inputs, which is why blocks of one class share one graph at all; it does not cover
  plain int attributes. The flag is read when dynamo traces, so it is set while the lever is on
  and put back by the undo (a per-call ``config.patch`` around each block costs ~15 us a call),
  and only where the blocks differ in an int attribute (:func:`differing_int_attributes`):
  blocks that do not are traced exactly as a plain ``block.compile()`` traces them. Blocks whose
  parameters differ in shape (the stages of a Swin, a ConvNeXt or a ResNet, which differ in
  width) are left specialised: their differing ints are the sizes of their tensors, and traced
  symbolic they make every shape in the block symbolic (a Swin stage's window arithmetic then
  took dynamo minutes per compile, 287 s for 3 steps of a tiny Swin on a CPU against 42 s for the
  whole model); each such stage is its own program, compiled once with its own shapes.
- Layers, not stages. Where the repeated blocks are such stages and each holds repeated layers
  of its own (a Swin's ``SwinLayer``s, a ConvNeXt's ``ConvNextLayer``s), compile-blocks compiles
  the layers (:func:`compile_units`): inductor took minutes for one Swin stage of up to 18
  layers traced as one program (issue 20, Swin-T on the H200), and a layer's program is shared
  by the layers of its stage.
- One program per kind of block, or none. Blocks of one class and shape still get a program each
  when a forward reads an attribute that differs between them and is not an int: stochastic
  depth (a Swin's or timm ViT's ``drop_path.drop_prob``, 0.0 to 0.1 across the blocks, and an
  ``Identity`` in the first block's place) is guarded by value and by type. Past dynamo's
  ``recompile_limit`` (8) the blocks after it would run uncompiled, silently; compile-blocks
  leaves eager the units that hold a single convolution or linear layer instead, where the rest
  are within the limit (:func:`plan_programs`: the ConvNormActs of an Inception block's branches),
  and otherwise refuses (:func:`block_programs`) and names the attribute: compile-model (one
  program for the whole model) is the form that applies there.
- inductor's autotuning quiet. Under a ``max-autotune`` mode inductor writes to stderr, for every
  matmul shape it autotunes, a table of the ten fastest of ~20 kernels and a JSON line of
  statistics, and logs an ERROR for each template it drops as too large for the GPU's shared
  memory ("Ignoring this choice"): ~300 lines for the zoo's BERT on an H100, in the middle of
  ``levers tune``'s progress at its default budget, where the autotuned forms are tried last.
  While the lever is on (:func:`quiet_autotuning`), the tables and statistics are off unless the
  user asked for them (``TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED``,
  ``TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS``), and the dropped templates' records are
  filtered out of inductor's log; its other errors and warnings pass.
- CUDA graphs in step. Under a mode that replays inductor's programs as CUDA graphs
  (:data:`CUDA_GRAPH_MODES`), the step marks each step's start
  (``torch.compiler.cudagraph_mark_step_begin``) and returns a copy of its loss
  (:func:`graph_step`): a graph's outputs are overwritten by its next replay. Where the
  parameters are not on a GPU there is nothing to replay (:func:`graph_blockers`).
"""

from __future__ import annotations

import ast
import logging
import os
import textwrap
from dataclasses import dataclass
from typing import Any, Callable

import torch

from levers.blocks import CONTAINERS, repeated_blocks
from levers.levers._find import forward_source

# inductor's modes that replay its programs as CUDA graphs
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")

Undo = Callable[[], None]


def compile_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules compile-blocks compiles: the repeated blocks; where those are stages of
    different widths, the repeated layers inside each stage (a stage of one layer stays whole)."""
    blocks = [block.module for block in repeated_blocks(model)]
    if len(blocks) < 2 or not stages_differ_in_shape(blocks):
        return blocks
    units: list[torch.nn.Module] = []
    for stage in blocks:
        layers = [layer.module for layer in repeated_blocks(stage)]
        units.extend(layers or [stage])
    return units


def block_programs(units: list[torch.nn.Module]) -> tuple[int, list[str]]:
    """How many programs dynamo builds for ``units`` compiled one by one, and the attributes that
    make blocks of one class and shape differ (``["drop_path.drop_prob", "drop_path (type)"]``).

    A program is shared by the blocks that agree in class, parameter shapes, the class of every
    submodule and every float, bool and string attribute (ints are traced unspecialised, see
    :func:`differing_int_attributes`).
    """
    groups: dict[tuple, list[dict[str, str]]] = {}  # by class and parameter shapes
    for unit in units:
        groups.setdefault(_parameter_shapes(unit), []).append(_traits(unit))
    differing: set[str] = set()
    for group in groups.values():
        names = set().union(*group)
        differing |= {name for name in names if len({t.get(name) for t in group}) > 1}
    return len(_by_program(units)), sorted(differing)


def _by_program(units: list[torch.nn.Module]) -> dict[tuple, list[torch.nn.Module]]:
    """The units grouped by the program dynamo builds for them (see :func:`block_programs`)."""
    programs: dict[tuple, list[torch.nn.Module]] = {}
    for unit in units:
        key = (_parameter_shapes(unit), tuple(sorted(_traits(unit).items())))
        programs.setdefault(key, []).append(unit)
    return programs


@dataclass(frozen=True)
class ProgramPlan:
    """Which units compile-blocks compiles and which it leaves eager (:func:`plan_programs`)."""

    compiled: list[torch.nn.Module]
    eager: list[torch.nn.Module]
    needed: int  # programs all the units would need
    of_layers: int  # programs the units of more than one convolution or linear layer need

    @property
    def programs(self) -> int:  # the programs the compiled units need
        return self.needed if not self.eager else self.of_layers

    @property
    def fits(self) -> bool:
        return self.programs <= recompile_limit()


def plan_programs(units: list[torch.nn.Module]) -> ProgramPlan:
    """The units compiled: all of them where their programs are within dynamo's recompile limit;
    past it, the units that hold a single convolution or linear layer (the ConvNormActs of an
    Inception block's branches, each of another width) stay eager, since inductor adds little
    around one layer's kernel, and the rest compile. Where the rest still need more programs
    than the limit (or are none), the plan does not fit and the lever refuses."""
    by_program = list(_by_program(units).values())
    of_layers = [group for group in by_program if not _one_layer(group[0])]
    if len(by_program) <= recompile_limit() or not 0 < len(of_layers) <= recompile_limit():
        return ProgramPlan(list(units), [], len(by_program), len(of_layers))
    compiled_ids = {id(unit) for group in of_layers for unit in group}
    return ProgramPlan(
        compiled=[unit for unit in units if id(unit) in compiled_ids],
        eager=[unit for unit in units if id(unit) not in compiled_ids],
        needed=len(by_program),
        of_layers=len(of_layers),
    )


_LAYERS = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def _one_layer(unit: torch.nn.Module) -> bool:
    return sum(isinstance(module, _LAYERS) for module in unit.modules()) <= 1


def shapes_per_class(units: list[torch.nn.Module]) -> dict[str, int]:
    """How many parameter shapes the units of each class come in (``{"ConvNormAct": 14}``):
    each is a program of its own, whatever their attributes."""
    shapes: dict[str, set[tuple]] = {}
    for unit in units:
        shapes.setdefault(type(unit).__name__, set()).add(_parameter_shapes(unit))
    return {name: len(seen) for name, seen in shapes.items()}


def _traits(unit: torch.nn.Module) -> dict[str, str]:
    """What dynamo guards by value in a block besides its shapes: submodule classes and the
    float, bool and string attributes (as their repr)."""
    traits = {}
    for path, module in unit.named_modules():
        if path:
            traits[f"{path} (type)"] = type(module).__qualname__
        for name, value in vars(module).items():
            if type(value) in (float, bool, str) and not name.startswith("_"):
                traits[f"{path}.{name}" if path else name] = repr(value)
    return traits


def _limit_name() -> str:
    """dynamo's name for the limit: ``recompile_limit`` (``cache_size_limit`` before torch 2.6)."""
    config = torch._dynamo.config
    return "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"


def recompile_limit() -> int:
    return int(getattr(torch._dynamo.config, _limit_name()))


def recompile_limit_at_least(programs: int) -> Undo:
    """Raise dynamo's ``recompile_limit`` to ``programs`` while the lever is on (a no-op where it
    is that high already). Blocks can differ in what no attribute shows: a ConvNeXt stage's first
    layer takes the bf16 output of the downsampling convolution under autocast, the others the
    fp32 residual, so a ConvNeXt-T's layers need 8 programs and one more hit the limit of 8 on
    the H200 (the layers after it ran uncompiled and compile-blocks read 0.98x)."""
    config, name = torch._dynamo.config, _limit_name()
    previous = getattr(config, name)
    if previous >= programs:
        return lambda: None
    setattr(config, name, programs)

    def undo() -> None:
        setattr(config, name, previous)

    return undo


def differing_int_attributes(blocks: list[torch.nn.Module]) -> list[str]:
    """The int attributes (``"self_attn.layer_idx"``) whose value differs between blocks of one
    class and one shape: the ones dynamo would specialise per block if a forward reads them.
    Blocks whose parameters differ in shape (stages of different widths) are not compared: their
    ints size their tensors."""
    values: dict[tuple, set[int]] = {}
    for block in blocks:
        shape = _parameter_shapes(block)
        for path, module in block.named_modules():
            for name, value in vars(module).items():
                if type(value) is int:  # not bool
                    key = (shape, f"{path}.{name}" if path else name)
                    values.setdefault(key, set()).add(value)
    return sorted({name for (_, name), seen in values.items() if len(seen) > 1})


def _parameter_shapes(block: torch.nn.Module) -> tuple:
    return (type(block),) + tuple(
        (name, tuple(param.shape)) for name, param in block.named_parameters()
    )


def stages_differ_in_shape(blocks: list[torch.nn.Module]) -> bool:
    """Whether the repeated blocks are stages of different widths (a parameter they all have
    differs in shape between them), which are compiled static: after the first stage, dynamo's
    automatic dynamic shapes would trace every later stage with symbolic sizes (a Swin stage's
    window arithmetic then takes minutes to trace: 90 s against 5 s static for a tiny Swin's
    first step on a CPU)."""
    shapes = [dict(block.named_parameters()) for block in blocks]
    shared = set.intersection(*(set(s) for s in shapes)) if shapes else set()
    # a parameter every block has, of another shape in some block: widths differ (a T5 stack's
    # first block only adds a parameter of its own)
    return any(len({tuple(s[name].shape) for s in shapes}) > 1 for name in shared)


def unspecialised_int_attributes() -> Undo:
    config = torch._dynamo.config
    if not hasattr(config, "allow_unspec_int_on_nn_module"):  # torch < 2.4: nothing to set
        return lambda: None
    previous = config.allow_unspec_int_on_nn_module
    config.allow_unspec_int_on_nn_module = True

    def undo() -> None:
        config.allow_unspec_int_on_nn_module = previous

    return undo


# inductor's settings of its autotuning reports, each with the variable that sets it from the
# environment (a user who set the variable asked for the report: it is left as they set it)
AUTOTUNE_REPORTS = {
    "autotune_num_choices_displayed": ("TORCHINDUCTOR_AUTOTUNE_NUM_CHOICES_DISPLAYED", 0),
    "max_autotune_report_choices_stats": ("TORCHINDUCTOR_MAX_AUTOTUNE_REPORT_CHOICES_STATS", False),
}
AUTOTUNE_LOGGER = "torch._inductor.select_algorithm"
DROPPED_CHOICE = "Ignoring this choice"


class _DroppedChoices(logging.Filter):
    """Drops inductor's record of a template it leaves out of the autotuning (too large for the
    GPU, say): it goes on with the other choices, so the ERROR is not the user's to act on."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return DROPPED_CHOICE not in record.getMessage()
        except Exception:  # noqa: BLE001 - a record that cannot format passes as it was
            return True


def quiet_autotuning(mode: str | None) -> Undo:
    """Quiets inductor's autotuning reports while a ``max-autotune`` mode is on (a no-op for the
    other modes); the undo puts the settings back and removes the log filter."""
    if not mode or "max-autotune" not in mode:
        return lambda: None
    import torch._inductor.config as inductor_config

    previous = {}
    for name, (variable, quiet) in AUTOTUNE_REPORTS.items():
        if hasattr(inductor_config, name) and variable not in os.environ:
            previous[name] = getattr(inductor_config, name)
            setattr(inductor_config, name, quiet)
    logger = logging.getLogger(AUTOTUNE_LOGGER)
    dropped = _DroppedChoices()
    logger.addFilter(dropped)

    def undo() -> None:
        for name, value in previous.items():
            setattr(inductor_config, name, value)
        logger.removeFilter(dropped)

    return undo


def graph_blockers(model: torch.nn.Module) -> list[str]:
    """Why no part of the step can be replayed as CUDA graphs: the parameters are not on a GPU."""
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cuda"}:
        return [
            f"CUDA graphs need the parameters on a GPU; they are on {', '.join(sorted(devices))}"
        ]
    return []


def graph_step(step: Callable[[], Any]) -> Callable[[], Any]:
    """``step`` marking each step's start for inductor's CUDA graphs and returning a copy of a
    tensor it returns (the loss lives in a graph's output buffer, which the next replay
    overwrites)."""

    def marked_step() -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        out = step()
        return out.clone() if isinstance(out, torch.Tensor) else out

    return marked_step


def liger_patched(model: torch.nn.Module) -> bool:
    """Whether Liger Kernel's kernels run in ``model`` (torch.compile over them fails)."""
    if getattr(model, "_levers_liger_kernels", False):
        return True
    for module in model.modules():
        forward = vars(module).get("forward")
        if forward is not None and getattr(forward, "__module__", "").startswith("liger_kernel"):
            return True
        if type(module).__module__.startswith("liger_kernel"):
            return True
    return False


def is_compiled(module: torch.nn.Module) -> bool:
    return getattr(module, "_compiled_call_impl", None) is not None


def forward_called_directly(
    model: torch.nn.Module, units: list[torch.nn.Module]
) -> str | None:
    """Where the model calls the ``forward`` of one of ``units`` by name (``layer.forward(x)``),
    in words, or None. Such a call skips the module call (``layer(x)``), and with it what hooks
    into that call: ``module.compile()`` compiles the module call, so a block called this way
    runs uncompiled (transformers' SqueezeBERT encoder: ``for layer in self.layers:
    layer.forward(...)``). Read from the source of the forward of the module that holds the
    units (their container's owner): a loop over the container whose variable's ``forward`` is
    called or handed on (``checkpoint(layer.forward, x)``), or ``self.<container>[i].forward``."""
    parents: dict[int, tuple[str, torch.nn.Module]] = {}
    for module in model.modules():
        for child_name, child in module.named_children():
            parents.setdefault(id(child), (child_name, module))
    looked: set[tuple[type, str]] = set()
    for unit in units:
        if id(unit) not in parents:
            continue
        name, holder = parents[id(unit)]
        if isinstance(holder, CONTAINERS) and id(holder) in parents:
            name, holder = parents[id(holder)]
        key = (type(holder), name)
        if key in looked:
            continue
        looked.add(key)
        call = _direct_forward_call(holder, name)
        if call is not None:
            return f"{type(holder).__name__}.forward calls its blocks' forward by name ({call})"
    return None


def _direct_forward_call(owner: torch.nn.Module, attribute: str) -> str | None:
    """The first use, in the forward of ``owner``'s class, of ``X.forward`` where X is a loop
    variable over ``self.<attribute>`` (or ``self.<attribute>[...]`` itself), called or handed on
    (to a checkpoint, say), as source text; None where there is none or the source cannot be
    read (:func:`levers.levers._find.forward_source`)."""
    source = forward_source(owner)
    try:
        tree = ast.parse(textwrap.dedent(source or ""))
    except SyntaxError:
        return None

    def over_container(node: ast.AST) -> bool:  # self.<attribute>, or a subscript of it
        while isinstance(node, ast.Subscript):
            node = node.value
        return (isinstance(node, ast.Attribute) and node.attr == attribute
                and isinstance(node.value, ast.Name) and node.value.id == "self")

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.For) and any(over_container(n) for n in ast.walk(node.iter)):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    calls = {id(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)}
    for node in ast.walk(tree):
        # a call of X.forward, or X.forward handed on (checkpoint(layer.forward, x))
        if not (isinstance(node, ast.Attribute) and node.attr == "forward"):
            continue
        held = node.value
        if (isinstance(held, ast.Name) and held.id in names) or over_container(held):
            return ast.unparse(node) + ("(...)" if id(node) in calls else "")
    return None
