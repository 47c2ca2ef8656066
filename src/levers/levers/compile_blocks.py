"""``compile-blocks``: regional ``torch.compile`` of each repeated block of the model.

The repeated blocks (:func:`levers.blocks.repeated_blocks`: a decoder's layers, a ViT's blocks;
the layers inside each stage where the blocks are stages of different widths, a Swin's or a
ConvNeXt's) are compiled one by one with ``module.compile()``: every block of one class shares the compiled
code, so compile time is one block's, and a graph break elsewhere in the model (data-dependent
control flow, a host read) costs nothing inside the blocks. The undo drops the compiled call
(the module's parameters and state_dict never change).

On a model as shipped the blocks would still compile once per block; the lever prevents it
(:mod:`levers.levers._compile_setup`): a Hugging Face config's KV cache is turned off while the
lever is on (``use_cache=False``, as Hugging Face's gradient checkpointing does in training;
put back by the undo), and integer module attributes that differ between blocks (``layer_idx``)
are traced unspecialised. Blocks that differ in what dynamo guards by value (stochastic depth's
``drop_prob``, different per block) would need a program each: past dynamo's recompile limit the
lever does not apply and says which attribute differs (compile-model applies there). Where the
programs past the limit are single layers (timm's inception_resnet_v2: its 39 repeated
Inception-ResNet blocks are 3 programs, the single ConvNormActs of its branches 14 more), the units
of one convolution or linear layer stay eager and the rest compile. Blocks that
differ in what no attribute shows (the dtype of their input: a ConvNeXt stage's first layer gets
bf16 under autocast, the rest fp32) get dynamo's recompile limit raised to the number of blocks
while the lever is on, so none of them runs uncompiled. Where the model calls a block's
``forward`` by name (transformers' SqueezeBERT encoder: ``layer.forward(...)``), which skips the
module call ``module.compile()`` compiles, the lever does not apply and says so
(:func:`levers.levers._compile_setup.forward_called_directly`; on an H100, s64, it had applied there and run
1.000x, compiling nothing).

Options: ``backend`` (default "inductor"), ``mode``, ``dynamic``, ``fullgraph``. Under a mode
that replays the blocks' programs as CUDA graphs (``mode=reduce-overhead``: a graph per block
program, the code between the blocks eager), the step marks each step's start and returns a copy
of its loss, as compile-model's does; that needs the parameters on a GPU. On timm's
inception_resnet_v2 (H100, s65, batch 64) it ran 1.871x eager after a 27-s warm-up, where
whole-model reduce-overhead compile ran 3.04x after 150 s; ``levers tune`` tries it where no other
compile form paid in the time (:data:`levers.tune.candidates.FALLBACK_FORMS`).

Fix safety: changes numerics (inductor fuses and reorders elementwise work). Tolerance checked:
1e-5 relative in fp32 (with the aot_eager backend on a CPU; inductor on a GPU).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from levers.levers import register
from levers.levers._compile_options import check_compile_options, compile_kwargs
from levers.levers._compile_setup import (
    CUDA_GRAPH_MODES,
    ProgramPlan,
    block_programs,
    compile_units,
    differing_int_attributes,
    forward_called_directly,
    graph_blockers,
    graph_step,
    is_compiled,
    liger_patched,
    plan_programs,
    quiet_autotuning,
    recompile_limit,
    recompile_limit_at_least,
    shapes_per_class,
    stages_differ_in_shape,
    unspecialised_int_attributes,
)
from levers.levers._find import training_cache_off
from levers.levers.lever import Lever, Target
from levers.vocab import CHANGES_NUMERICS

ID = "compile-blocks"
OPTIONS = ("backend", "mode", "dynamic", "fullgraph")


def check(options: dict[str, Any]) -> None:
    check_compile_options(ID, options)


def applies(target: Target) -> str | None:
    blocks = compile_units(target.model)
    if not blocks:
        return "no repeated blocks (a ModuleList or Sequential of two or more modules of one class)"
    if any(is_compiled(b) for b in blocks):
        return "the blocks are already compiled"
    if is_compiled(target.model):
        return "the whole model is compiled already (compile-model); use one of the two"
    if liger_patched(target.model):
        return (
            "the model runs Liger Kernel's kernels: torch.compile over them fails in dynamo "
            "(torch 2.11); use compile-blocks or liger-kernels, not both"
        )
    mode = target.options.get("mode")
    blockers = graph_blockers(target.model) if mode in CUDA_GRAPH_MODES else []
    if blockers:
        return f"mode={mode} replays CUDA graphs, but {'; '.join(blockers)}"
    direct = forward_called_directly(target.model, blocks)
    if direct:
        return (
            f"{direct}, which skips the module call that module.compile() compiles: the blocks "
            "would run uncompiled; use compile-model (its trace of the whole forward reaches "
            "them)"
        )
    plan = plan_programs(blocks)
    if not plan.fits:
        programs, differing = block_programs(blocks)
        if differing:
            shown = ", ".join(differing[:3]) + (", ..." if len(differing) > 3 else "")
            why = f"differ in {shown} (stochastic depth, say), which dynamo guards by value"
        else:  # of several classes, or one class in several widths: no attribute to name
            shapes = shapes_per_class(blocks)
            widths = [f"{name} in {n} shapes" for name, n in sorted(shapes.items()) if n > 1]
            why = f"are of {len(shapes)} class{'es' if len(shapes) > 1 else ''}" + (
                f", {', '.join(widths[:3])}" if widths else "")
        return (
            f"the {len(blocks)} blocks {why}: compiled one by one they need {programs} programs, "
            f"more than dynamo's recompile limit ({recompile_limit()}), each a compile of its "
            f"own{_without_single_layers(plan)}; use compile-model (one program for the whole "
            "model)"
        )
    return None


def _without_single_layers(plan: ProgramPlan) -> str:
    if plan.of_layers == plan.needed:  # no unit of a single layer to leave eager
        return ""
    if plan.of_layers == 0:
        return ", each a single convolution or linear layer, which inductor adds little to"
    return (f", and {plan.of_layers} without those of a single convolution or linear layer "
            "(left eager where that brings them within it)")


def patch(target: Target) -> Callable[[], None]:
    options = compile_kwargs(ID, target.options, OPTIONS)
    plan = plan_programs(compile_units(target.model))
    blocks = plan.compiled
    undo_cache = training_cache_off(target.model)
    differing = differing_int_attributes(blocks)
    undo_ints = unspecialised_int_attributes() if differing else (lambda: None)
    if "dynamic" not in options and stages_differ_in_shape(blocks):
        options["dynamic"] = False  # each stage its own static program
    # at worst a program per block (and one more where an int is first specialised): never
    # past the limit, where the blocks after it would run uncompiled
    undo_limit = recompile_limit_at_least(len(blocks) + 1)
    undo_quiet = quiet_autotuning(options.get("mode"))
    for block in blocks:
        block.compile(**options)
    if options.get("mode") in CUDA_GRAPH_MODES and target.step is not None:
        target.step = graph_step(target.step)

    def undo() -> None:
        for block in blocks:
            # back to nn.Module's class default (None): the instance as it was
            vars(block).pop("_compiled_call_impl", None)
        undo_quiet()
        undo_limit()
        undo_ints()
        undo_cache()

    undo.differing_int_attributes = differing  # type: ignore[attr-defined]
    undo.dynamic = options.get("dynamic")  # type: ignore[attr-defined]
    undo.left_eager = len(plan.eager)  # type: ignore[attr-defined]
    return undo


LEVER = register(
    Lever(
        options=OPTIONS,
        check=check,
        id=ID,
        title="torch.compile each repeated block (regional compilation)",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("NORM001", "ELEM001", "FUSE001", "FUSE002", "COMP001"),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        # the weights' layout is traced into the program: a layout lever goes first
        after=("channels-last",),
        known_problems=(
            "fails over Liger-patched modules (dynamo, torch 2.11); the first steps pay the "
            "compile time (one block's); a new input shape recompiles; blocks that differ in "
            "structure (a T5 stack's first block, the stages of a ResNet) compile once each"
        ),
    )
)
