"""Compiled modules in a predicted step: what ``torch.compile`` keeps for backward, on fakes.

Per-block compile (lever ``compile-blocks``) changes a step's memory mostly through what it
saves for backward: inductor's min-cut partitioner recomputes cheap elementwise ops in the
backward instead of saving their outputs (the HF llama 1b at batch 4 on an H200: 29.47 GiB
allocated eager, 24.09 GiB compiled per layer). A prediction of that step compiles the same
blocks, on the fakes, with :func:`backend`: AOTAutograd with inductor's decompositions,
inductor's joint-graph passes and its partitioner (``torch._inductor.compile_fx.partition_fn``:
the min-cut rematerialization), the graphs then run op by op (no code generation). Three things
keep that one graph per block, and faithful, inside the stand-in:

- the stand-in's torch-function mode is taken off the stack while a compiled module runs, and
  the tracker's global module hooks out of the hook tables (:func:`run_outside_stand_in`):
  dynamo would trace into the mode itself and break the graph at every device question it
  answers, and it would guard on the module stack the hooks keep, compiling every block again.
  The tracker stays (its ``ignore_compile_internals`` keeps it off while dynamo compiles and on
  while the compiled graphs run), so each op of the graphs is booked as before, on the GPU when
  an input is, with the compiled module's name;
- the graph's ``scaled_dot_product_attention`` is routed to the stand-in's SDPA handler
  before AOTAutograd traces it, so the graph holds the target GPU's attention kernel (flash,
  cuDNN, memory-efficient; their outputs, logsumexp and workspaces) instead of the CPU's
  decomposition into a full score matrix; inductor keeps those kernels as they are too;
- while the backend traces, :mod:`levers.memory.composites` takes CUDA's paths (``rms_norm``
  calls ``_fused_rms_norm``, which inductor's decompositions then split): dynamo's fakes are
  not in the stand-in's book, and the CPU's composites save other tensors.

Inductor fuses the elementwise ops of a graph, so their intermediates never exist: a pointwise
op whose every user is another pointwise op or a reduction (through views), which the graph
does not return and which is read by at most inductor's ``realize_reads_threshold`` users, is
computed inside its users' kernels. :func:`fused_intermediates` finds those ops in each
partitioned graph (forward and backward) and the graph runs them unbooked (:func:`fusing`: the
tracker gives their outputs no memory); every other op's output is booked as inductor's buffer
for it. Without this the backward of a llama block's MLP books four float32 tensors of
[tokens, 5632] that inductor never makes: 7.7 GiB at batch 45 x 2048. What is not modelled:
inductor's choice to realise a buffer with many reads or a costly body, and the scheduler's
reuse of one buffer for the next. Attention calls inside compiled graphs are described by the
graph's trace and recorded at each run of the compiled forward.

While a prediction runs, :func:`predicting` makes every ``torch.compile`` use :func:`backend`
(``torch.compiler.set_stance(force_backend=...)``) and names the SDPA handler it routes to;
the backend refuses to compile outside a prediction. A module compiled another way than
``Module.compile()`` (``torch.compile(model)``'s wrapper) is compiled by it too, but with the
stand-in on the stack, where dynamo breaks the graph at the mode's device questions.

dynamo, inductor and functorch's compile are imported inside the functions that run while a
module compiles: they take seconds to import, and most predictions compile nothing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch._functorch import config as functorch_config
from torch.nn.modules import module as module_api
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext

# the SDPA handler of the prediction that runs, (func, args, kwargs) -> output, and the graphs
# compiled for it; one prediction at a time
_active: dict[str, Any] = {}

ASSUMPTION = (
    "compiled modules were predicted with inductor's partition of each graph (min-cut "
    "rematerialization, on fakes), their elementwise ops fused as inductor fuses them (a "
    "pointwise op read only by pointwise ops and reductions makes no buffer); inductor's reuse "
    "of buffers within a graph is not modelled"
)

# pointwise in inductor's sense though not tagged so: casts and constants it inlines
_INLINED = frozenset({
    torch.ops.aten._to_copy.default, torch.ops.aten.full.default,
    torch.ops.aten.scalar_tensor.default, torch.ops.aten.full_like.default,
    torch.ops.aten.zeros_like.default, torch.ops.aten.ones_like.default,
})


@dataclasses.dataclass(frozen=True)
class CompiledGraph:
    """One graph the backend compiled: the compiled module it is from (``model.layers.0``), its
    attention calls, and what its forward saves for backward (the partition's choice; the
    module's inputs and parameters left out)."""

    module: str
    num_attention_calls: int
    num_saved: int
    saved_bytes: int
    attention: tuple = ()  # the SDPA calls' descriptions (levers.memory.sdpa.SdpaCall)


@contextlib.contextmanager
def predicting(
    sdpa_handler: Callable[..., Any], record_attention: Callable[[Any], None] = lambda call: None
) -> Iterator[list[CompiledGraph]]:
    """Compile everything that compiles in this prediction with :func:`backend` (whatever
    backend the workload or a lever asked for: inductor's code cannot run on fakes), which
    routes attention to ``sdpa_handler``; each run of a compiled forward passes the
    descriptions of its attention calls to ``record_attention`` (the handler describes them
    once, while the graph is traced: :func:`note_traced_attention`). Yields the list of the
    graphs compiled, filled as they are. Dynamo's caches are cleared on exit when anything
    compiled, so that a graph compiled for these fakes is never reused (not another
    prediction's, not a real run's)."""
    graphs: list[CompiledGraph] = []
    _active.update(sdpa=sdpa_handler, graphs=graphs, record_attention=record_attention)
    try:
        with torch.compiler.set_stance("default", force_backend=backend):
            yield graphs
    finally:
        _active.clear()
        if graphs:
            torch._dynamo.reset()
            forget_dispatch_caches()


def forget_dispatch_caches() -> None:
    """Drop the Python dispatcher's cached kernel choices. AOTAutograd traces under it, and it
    caches, per op and dispatch key, the kernels levers registers for a prediction
    (:mod:`levers.memory.composites`, :mod:`levers.memory.autocast`): once those are removed, a
    stale choice would send a later compile (the real step's) to a key with no kernel, which
    silently drops the op's gradient. Called where they are removed."""
    for op in list(torch._ops.get_cached_ops()):
        op._dispatch_cache.clear()
    torch._ops.reset_cached_ops()


def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """A ``torch.compile`` backend: inductor's decompositions and partition, graphs run by ops."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.compile_fx import partition_fn, select_decomp_table
    from functorch.compile import make_boxed_func

    handler = _active.get("sdpa")
    if handler is None:
        raise RuntimeError(
            "levers.memory.compiled.backend compiles only inside a memory prediction"
        )
    num_attention_calls = _route_sdpa(gm, handler)
    name = _active.get("module", "?")
    num_user_outputs = _num_outputs(gm)
    graphs, record = _active["graphs"], _active["record_attention"]
    traced: list[Any] = []

    def forward_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        num_saved, saved_bytes = _saved_by(graph, num_user_outputs)
        run_fused(graph)
        # AOTAutograd traces the graph more than once; the last trace is the compiled one
        attention = tuple(traced[len(traced) - num_attention_calls :])
        graphs.append(
            CompiledGraph(name, num_attention_calls, num_saved, saved_bytes, attention)
        )
        forward = make_boxed_func(graph.forward)

        def run(args: list[Any]) -> Any:
            for call in attention:
                record(call)
            return forward(args)

        run._boxed_call = True  # type: ignore[attr-defined]
        return run

    def backward_compiler(graph: torch.fx.GraphModule, inputs: list[Any]) -> Any:
        run_fused(graph)
        return make_boxed_func(graph.forward)

    # the settings inductor compiles with (torch._inductor.compile_fx.compile_fx)
    with functorch_config.patch(unlift_effect_tokens=True), _tracing(traced):
        return aot_autograd(
            fw_compiler=forward_compiler,
            bw_compiler=backward_compiler,
            decompositions=select_decomp_table(),
            partition_fn=partition_fn,
        )(gm, example_inputs)



def _kind(node: torch.fx.Node) -> str:
    """``pointwise``, ``reduction``, ``view`` or ``other``: how inductor treats the node's op."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return "other"
    if torch.Tag.pointwise in target.tags or target in _INLINED:
        return "pointwise"
    if torch.Tag.reduction in target.tags:
        return "reduction"
    return "view" if target.is_view else "other"


def fused_intermediates(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The pointwise nodes of ``graph`` that inductor computes inside their users' kernels: not
    returned by the graph, and read (directly or through views) only by pointwise ops and
    reductions, by no more than ``realize_reads_threshold`` users."""
    from torch._inductor import config as inductor_config

    returned = _returned(graph)
    threshold = inductor_config.realize_reads_threshold
    memo: dict[torch.fx.Node, bool] = {}

    def read_inside_kernels(node: torch.fx.Node) -> bool:
        if node not in memo:
            users = list(node.users)
            memo[node] = (
                node not in returned
                and 0 < len(users) <= threshold
                and all(
                    _kind(user) in ("pointwise", "reduction")
                    or (_kind(user) == "view" and read_inside_kernels(user))
                    for user in users
                )
            )
        return memo[node]

    return {n for n in graph.nodes if _kind(n) == "pointwise" and read_inside_kernels(n)}


def _returned(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    returned: set[torch.fx.Node] = set()
    torch.fx.node.map_arg(_output_node(graph).args, returned.add)
    return returned


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def run_fused(gm: torch.fx.GraphModule) -> int:
    """Make ``gm`` run its fused intermediates (:func:`fused_intermediates`) unbooked; returns
    their number."""
    fused = fused_intermediates(gm.graph)
    for node in fused:
        node.target = _Unbooked(node.target)
    if fused:
        gm.recompile()
    return len(fused)


class _Unbooked:
    """An op whose outputs the tracker does not book while it runs (:func:`fusing`)."""

    def __init__(self, op: Any) -> None:
        self.op = op
        self.__name__ = f"fused_{op.__name__.replace('.', '_')}"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _active["fusing"] = _active.get("fusing", 0) + 1
        try:
            return self.op(*args, **kwargs)
        finally:
            _active["fusing"] -= 1


def fusing() -> bool:
    """Whether the op running now is one that inductor fuses into its users: the tracker books
    no memory for its outputs."""
    return _active.get("fusing", 0) > 0


def tracing() -> bool:
    """Whether the backend is tracing a graph now: the tensors then are dynamo's fakes, which
    stand for the GPU's (:mod:`levers.memory.composites` takes CUDA's paths for them)."""
    return "traced" in _active


def note_traced_attention(call: Any) -> None:
    """Keep the description of an attention call that the graph being traced makes."""
    _active["traced"].append(call)


@contextlib.contextmanager
def _tracing(traced: list[Any]) -> Iterator[None]:
    _active["traced"] = traced
    try:
        yield
    finally:
        _active.pop("traced", None)


def _route_sdpa(gm: torch.fx.GraphModule, handler: Callable[..., Any]) -> int:
    """Point the graph's SDPA calls at the stand-in's handler, which AOTAutograd then traces
    into the target GPU's attention op; returns their number."""
    routed = functools.partial(_sdpa_call, handler)
    changed = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is F.scaled_dot_product_attention:
            node.target = routed
            changed += 1
    if changed:
        gm.recompile()
    return changed


def _saved_by(forward: torch.fx.GraphModule, num_user_outputs: int) -> tuple[int, int]:
    """The tensors a partitioned forward returns for backward (its outputs past the user's),
    and the bytes of their storages (a view keeps its whole base); inputs (parameters, the
    block's input) are not new memory and are left out, as are sizes (symbolic ints)."""
    inputs = {
        n.meta["val"].untyped_storage()._cdata
        for n in forward.graph.nodes
        if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)
    }
    output = _output_node(forward.graph)
    num_saved = 0
    storages: dict[int, int] = {}
    for node in dict.fromkeys(output.args[0][num_user_outputs:]):
        value = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(value, torch.Tensor):
            continue
        storage = value.untyped_storage()
        if storage._cdata in inputs:  # an input or a view of one (a weight's transpose)
            continue
        num_saved += 1
        storages[storage._cdata] = storage.nbytes()
    return num_saved, sum(storages.values())


def _num_outputs(gm: torch.fx.GraphModule) -> int:
    output = _output_node(gm.graph)
    return len(torch.utils._pytree.tree_leaves(output.args[0]))


def _sdpa_call(handler: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return handler(F.scaled_dot_product_attention, args, kwargs)


def compiled_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules that ``Module.compile()`` compiled (compile-blocks' blocks, compile-model's
    model), by name."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if vars(module).get("_compiled_call_impl") is not None
    ]


def compiled_loss(model: torch.nn.Module) -> Callable[..., Any] | None:
    """The compiled loss function compile-loss set on a Hugging Face model (its
    ``_loss_function``, a ``torch.compile``d function), or None."""
    function = vars(model).get("_loss_function")
    return function if hasattr(function, "_torchdynamo_orig_callable") else None


def run_outside_stand_in(
    module: torch.nn.Module,
    stand_in: torch.overrides.TorchFunctionMode,
    module_stack: list[str],
    name: str,
    observer: Callable[[Any], None] | None,
) -> None:
    """Run ``module``'s compiled call with ``stand_in`` off the torch-function mode stack and
    the tracker's global module hooks (:data:`SITE_HOOK`) out of the hook tables, both of
    which dynamo would trace (the hooks read the module stack, so dynamo guarded on it and
    compiled every block again); the module's name is on ``module_stack`` instead (its
    allocations and backward are the module's, not its submodules'), and ``observer`` sees the
    result (to label the compiled backward node with the module)."""
    module._compiled_call_impl = outside_stand_in(
        vars(module)["_compiled_call_impl"], stand_in, module_stack, name, observer)


def outside_stand_in(
    compiled: Callable[..., Any],
    stand_in: torch.overrides.TorchFunctionMode,
    module_stack: list[str],
    name: str,
    observer: Callable[[Any], None] | None,
) -> Callable[..., Any]:
    """``compiled`` (a compiled module's call, or compile-loss's compiled loss function) called
    as :func:`run_outside_stand_in` describes, under the name ``name``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        module_stack.append(name)
        _active["module"] = name  # what the backend's graphs, if it compiles now, are of
        try:
            with _without_mode(stand_in), _without_site_hooks():
                result = compiled(*args, **kwargs)
            if observer is not None:
                observer(result)
            return result
        finally:
            module_stack.pop()
            _active.pop("module", None)

    call.__wrapped__ = compiled  # type: ignore[attr-defined]
    return call


@contextlib.contextmanager
def _without_mode(mode: torch.overrides.TorchFunctionMode) -> Iterator[None]:
    """``mode`` off the torch-function mode stack, and with it a ``torch.device("cuda")``
    context (a factory without a device runs under one): without the stand-in to rewrite its
    device, dynamo would put CUDA tensors in the graph, which a CPU build cannot make. A
    tensor that the graph makes from no GPU input (``torch.arange`` in a block) is then booked
    on the host."""
    from torch._dynamo.utils import set_torch_function_mode_stack

    stack = _get_current_function_mode_stack()

    def hidden(m: Any) -> bool:
        return m is mode or (
            isinstance(m, DeviceContext) and torch.device(m.device).type == "cuda"
        )

    if not any(hidden(m) for m in stack):
        yield
        return
    set_torch_function_mode_stack([m for m in stack if not hidden(m)])
    try:
        yield
    finally:
        set_torch_function_mode_stack(stack)


# set on the tracker's global module hooks, which compiled modules run without
SITE_HOOK = "_levers_site_hook"


@contextlib.contextmanager
def _without_site_hooks() -> Iterator[None]:
    tables = (module_api._global_forward_pre_hooks, module_api._global_forward_hooks)
    saved = [dict(table) for table in tables]
    for table, entries in zip(tables, saved):
        for key, hook in entries.items():
            if getattr(hook, SITE_HOOK, False):
                del table[key]
    try:
        yield
    finally:
        for table, entries in zip(tables, saved):
            table.clear()
            table.update(entries)
