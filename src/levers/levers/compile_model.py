"""``compile-model``: ``torch.compile`` of the whole model, with CUDA graphs where the step is static.

The model's forward (and so its backward) is compiled as one program with ``model.compile()``:
inductor fuses across block boundaries, the embedding and the head and loss, which regional
compilation (compile-blocks) cannot, at the price of a longer first step and of a graph break
anywhere in the model splitting the program. The optimizer step stays as it is.

``mode`` (option; default ``"auto"``) picks ``"reduce-overhead"`` (CUDA graphs: the step's
kernels replayed with one launch, which pays on host-bound steps such as a ViT-B/16 at batch 64)
where the step is static, and inductor's default mode where it is not, for the reasons
:func:`static_step_reasons` gives (the parameters are not on a GPU; a mixture-of-experts routes
tokens by data-dependent indices). The undo's ``mode`` and ``reasons`` say what was chosen and why.
The audit's HOST001 recommends it when a GPU step spends a tenth of its time in launch gaps.
Under CUDA graphs the step marks each step's start (``torch.compiler.cudagraph_mark_step_begin``)
and returns a copy of its loss: a graph's outputs are overwritten by its next replay.

Like compile-blocks, it turns a Hugging Face config's KV cache off while on and traces integer
module attributes unspecialised (:mod:`levers.levers._compile_setup`).

``backend=cudagraphs`` replays the step's own (eager) kernels as CUDA graphs, through dynamo and
AOTAutograd, without inductor: no fusion, but a first step that traces rather than compiles
(timm's inception_resnet_v2 on this project's CPU: 19 s against inductor's 122 s; on an H200
inductor's took ~210 s, more than a 3-minute tune budget). It pays where eager's launches bound
the step, not where its kernels do: on inception_resnet_v2 (H100) it ran 1.045x where
reduce-overhead compile, inductor's kernels under graphs, ran 3.2x. ``levers tune`` tries it
where no inductor form paid in the time it had. Its numerics are eager's kernels', in the order
eager runs them.

Options: ``mode`` (auto | default | reduce-overhead | max-autotune | max-autotune-no-cudagraphs;
inductor's only), ``backend`` (default "inductor"; "cudagraphs" as above), ``dynamic``,
``fullgraph``.

Fix safety: changes numerics (inductor fuses and reorders elementwise work). Tolerance checked:
1e-5 relative in fp32 (with the aot_eager backend on a CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Callable

import torch

from levers.levers import register
from levers.blocks import repeated_blocks
from levers.levers._compile_options import check_compile_options, compile_kwargs
from levers.levers._compile_setup import (
    CUDA_GRAPH_MODES,
    differing_int_attributes,
    graph_blockers,
    graph_step,
    is_compiled,
    liger_patched,
    quiet_autotuning,
    unspecialised_int_attributes,
)
from levers.levers._find import training_cache_off
from levers.levers.lever import Lever, Target, parse_lever_spec
from levers.vocab import CHANGES_NUMERICS

ID = "compile-model"
OPTIONS = ("mode", "backend", "dynamic", "fullgraph")
MODES = ("auto", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def static_step_reasons(model: torch.nn.Module) -> list[str]:
    """Why ``mode=auto`` does not replay the step as CUDA graphs (empty when it does, as far as
    the model shows: a step whose input shapes change still recompiles, and a host-device sync in
    the step still waits; neither is seen without running the step, so HOST001 reads both from a
    capture): :func:`graph_blockers`, and a mixture of experts, whose routing by data-dependent
    indices inductor's CUDA graphs skip where they cannot capture it (asked for by name,
    ``mode=reduce-overhead``, the graphs run where they can: on the zoo's mixtral on an H100, s51,
    reduce-overhead compile ran 1.77x eager where the default mode ran 1.68x)."""
    reasons = graph_blockers(model)
    experts = [name for name, m in model.named_modules() if name.split(".")[-1] == "experts"]
    if experts:
        reasons.append(
            f"{experts[0]} is a mixture of experts: tokens are routed by data-dependent indices "
            "(nonzero, where), which a CUDA graph cannot capture"
        )
    return reasons


def inductor_mode(mode: str, reasons: Sequence[str]) -> str:
    """The inductor mode that ``mode`` runs in: ``auto`` is reduce-overhead (CUDA graphs) on a
    static step (no ``reasons``: :func:`static_step_reasons`) and the default mode elsewhere."""
    if mode != "auto":
        return mode
    return "default" if reasons else "reduce-overhead"


def replays_inductor_graphs(specs: Any, model: torch.nn.Module) -> bool:
    """Whether one of the lever specs ``specs`` (``compile-model:mode=reduce-overhead``) compiles
    ``model`` with inductor and replays the program as CUDA graphs: a CUDA-graph mode, or
    ``mode=auto`` on a static step (:func:`static_step_reasons`); compile-blocks in a CUDA-graph
    mode (its blocks' programs). ``backend=cudagraphs`` replays eager's kernels, not inductor's,
    and is not one."""
    for spec in specs:
        lever, options = parse_lever_spec(spec)
        if options.get("backend", "inductor") != "inductor":
            continue
        if lever == "compile-blocks":
            mode = str(options.get("mode", "default"))
        elif lever == "compile-model":
            mode = inductor_mode(str(options.get("mode", "auto")), static_step_reasons(model))
        else:
            continue
        if mode in CUDA_GRAPH_MODES:
            return True
    return False


def check(options: dict[str, Any]) -> None:
    """The options, before anything is built: :func:`check_compile_options`, and no inductor
    mode beside ``backend=cudagraphs``."""
    check_compile_options(ID, options, MODES)
    mode = str(options.get("mode", "auto"))
    if _graphs_backend(options) and mode != "auto":
        raise ValueError(
            f"compile-model: mode={mode} is inductor's; backend=cudagraphs takes no mode "
            "(it replays eager's kernels as CUDA graphs)"
        )


def _mode(target: Target) -> str:
    check(target.options)
    return str(target.options.get("mode", "auto"))


def _graphs_backend(options: dict[str, Any]) -> bool:
    """backend=cudagraphs: the step's eager kernels replayed as CUDA graphs, no inductor."""
    return str(options.get("backend", "inductor")) == "cudagraphs"


def applies(target: Target) -> str | None:
    mode = _mode(target)
    if is_compiled(target.model):
        return "the model is already compiled"
    if any(is_compiled(m) for m in target.model.modules()):
        return "parts of the model are compiled already (compile-blocks); use one of the two"
    if liger_patched(target.model):
        return (
            "the model runs Liger Kernel's kernels: torch.compile over them fails in dynamo "
            "(torch 2.11); use compile-model or liger-kernels, not both"
        )
    reasons = static_step_reasons(target.model)
    if _graphs_backend(target.options) and reasons:
        return f"backend=cudagraphs replays CUDA graphs, but {'; '.join(reasons)}"
    blockers = graph_blockers(target.model)
    if mode in CUDA_GRAPH_MODES and blockers:
        return f"mode={mode} replays CUDA graphs, but {'; '.join(blockers)} (use mode=auto)"
    return None


def patch(target: Target) -> Callable[[], None]:
    mode = _mode(target)
    reasons = static_step_reasons(target.model)
    graphs_backend = _graphs_backend(target.options)
    if graphs_backend:
        mode = "cudagraphs"  # no inductor mode: the backend is the graphs
    else:
        mode = inductor_mode(mode, reasons)
    options = compile_kwargs(ID, target.options, tuple(k for k in OPTIONS if k != "mode"))
    if mode not in ("default", "cudagraphs"):
        options["mode"] = mode
    undo_cache = training_cache_off(target.model)
    blocks = [b.module for b in repeated_blocks(target.model)]
    differing = differing_int_attributes(blocks)
    undo_ints = unspecialised_int_attributes() if differing else (lambda: None)
    undo_quiet = quiet_autotuning(mode)
    target.model.compile(**options)
    if (mode in CUDA_GRAPH_MODES or graphs_backend) and target.step is not None:
        target.step = graph_step(target.step)

    def undo() -> None:
        # back to nn.Module's class default (None): the instance as it was
        vars(target.model).pop("_compiled_call_impl", None)
        undo_quiet()
        undo_ints()
        undo_cache()

    undo.mode = mode  # type: ignore[attr-defined]
    undo.reasons = reasons  # type: ignore[attr-defined]
    return undo


LEVER = register(
    Lever(
        options=OPTIONS,
        check=check,
        id=ID,
        title="torch.compile the whole model (CUDA graphs where the step is static)",
        safety=CHANGES_NUMERICS,
        tolerance=1e-5,
        fixes=("NORM001", "ELEM001", "COMP001", "HOST001"),
        applies=applies,
        patch=patch,
        needs_gpu=True,
        # the weights' layout is traced into the program: a layout lever goes first
        after=("channels-last",),
        known_problems=(
            "on the ViT-B/16 at batch 64 it equals whole-model compile with reduce-overhead (it is "
            "that recipe), no more; the first step pays the whole model's compile time; a graph break splits the program (COMP001 finds them); "
            "reduce-overhead holds a CUDA-graph memory pool and recompiles on a new shape; fails "
            "over Liger-patched modules (torch 2.11); backend=cudagraphs fuses nothing (eager's "
            "kernels, replayed)"
        ),
    )
)
