"""Live accounting of a fake step: every storage the GPU would allocate, with where and when.

:class:`StorageTracker` is a ``TorchDispatchMode`` that sits above the fake mode. After each
aten op it books the op's new storages (a view or an in-place op makes none) on the GPU or the
host (see :class:`levers.memory.standin.DeviceBook`), records the GPU ones with the phase,
module and op that made them, adds the kernel's workspaces, and registers a callback that logs
the free when the storage dies. Frees happen when Python drops the last reference, the same
moment the GPU run would free the block, because the fake step holds exactly the references that
the real one would (autograd's saved tensors included).

:class:`SiteContext` knows the phase (from optimizer hooks and autograd's graph task), the
module (from global forward hooks; in backward, from the autograd node that runs, annotated in
forward with the module that created it) and the step.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as module_api
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from levers.capture.ops import op_flops
from levers.memory import kernels
from levers.memory.compiled import SITE_HOOK, fusing
from levers.memory.shadow import ShadowValues
from levers.memory.standin import GPU, HOST, DeviceBook
from levers.memory.trace import Allocation, LossCall, Trace
from levers.user_code import is_user_file

_NODE_KEY = "levers.module"
_NODE_SOURCE_KEY = "levers.source"


class SiteContext:
    """The phase, step and module that an allocation happens in."""

    def __init__(self) -> None:
        self.step = -1
        self.in_optimizer = False
        self.backward_seen = False
        self.module_stack: list[str] = []

    def phase(self) -> str:
        if self.step < 0:
            return "build"
        if self.in_optimizer:
            return "optimizer"
        if torch._C._current_graph_task_id() != -1:
            return "backward"
        return "other" if self.backward_seen else "forward"

    def module(self, phase: str) -> str | None:
        if self.module_stack:
            return self.module_stack[-1]
        if phase == "backward":
            node = torch._C._current_autograd_node()
            if node is not None:
                return node.metadata.get(_NODE_KEY)
        return None

    def backward_source(self) -> str | None:
        """The step's source line of the forward op whose backward is running, if known."""
        node = torch._C._current_autograd_node()
        return node.metadata.get(_NODE_SOURCE_KEY) if node is not None else None

    def start_step(self, step: int) -> None:
        self.step = step
        self.backward_seen = False
        self.in_optimizer = False


class _Record:
    __slots__ = (
        "call",
        "category",
        "dtype",
        "module",
        "nbytes",
        "op",
        "phase",
        "recompute",
        "shape",
        "source",
        "state_derived",
        "step",
        "flops",
    )  # fmt: skip

    def __init__(self, **fields: Any) -> None:
        for name, value in fields.items():
            setattr(self, name, value)

    def freeze(self) -> Allocation:
        return Allocation(**{name: getattr(self, name) for name in self.__slots__})


class StorageTracker(TorchDispatchMode):
    """Books and records every storage the step allocates; see the module docstring."""

    def __init__(
        self,
        book: DeviceBook,
        context: SiteContext,
        kernel_model: kernels.KernelModel,
        shadow: ShadowValues | None = None,
    ) -> None:
        super().__init__()
        self.book = book
        self.context = context
        self.kernel_model = kernel_model
        self.shadow = shadow
        self.records: list[_Record] = []
        self.events: list[int] = []
        self.backward_starts: dict[int, int] = {}
        self.losses: list[LossCall] = []
        self.sdpa_calls: list = []
        self.assumptions: list[str] = []
        self._handles: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: dict[int, int] = {}  # handle -> live storages that hold it
        self._node_of: dict[int, int] = {}  # handle -> id of the autograd node that made it
        self._workspace_owners: set = set()
        self._state_handles: set[int] = set()
        self._num_calls = 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # off while torch.compile compiles (dynamo would otherwise skip every frame under this
        # mode), on while the compiled graphs run, which books their ops as any other
        return True

    # --- dispatch -------------------------------------------------------------------------

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = NotImplemented
        if self.shadow is not None:
            out = self.shadow.answer(func, args, kwargs)
        if out is NotImplemented:
            out = func(*args, **kwargs)
        phase = self.context.phase()
        if phase == "backward" and self.context.step not in self.backward_starts:
            self.backward_starts[self.context.step] = len(self.events)
            self.context.backward_seen = True
        inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        self._num_calls += 1
        if phase == "backward" and self._accumulates_in_place(func, args, out):
            self._alias(out.untyped_storage(), args[0].untyped_storage())
        self._book_outputs(func, args, kwargs, out, inputs, outputs, phase)
        self._add_workspaces(func, args, kwargs, out, inputs, phase)
        if self.shadow is not None:
            self.shadow.after(func, args, kwargs, out)
        return out

    def _book_outputs(self, func, args, kwargs, out, inputs: list, outputs: list, phase: str) -> None:
        new = []
        for tensor in outputs:
            try:
                storage = tensor.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            if storage in self._handles:
                continue
            new.append((tensor, storage))
        if not new:
            return
        device = self._op_device(inputs)
        unbooked = fusing()  # computed inside its users' kernels by inductor: no buffer
        state_derived = phase == "optimizer" and any(self._is_state(t) for t in inputs)
        flops = op_flops(func, args, kwargs, out) if phase == "forward" else 0
        for tensor, storage in new:
            self.book.book(storage, device)
            if device != GPU or storage.nbytes() == 0 or unbooked:
                self._handles[storage] = 0
                continue
            handle = self._record(
                nbytes=storage.nbytes(),
                phase=phase,
                op=str(func),
                shape=tuple(tensor.shape),
                dtype=str(tensor.dtype).removeprefix("torch."),
                state_derived=state_derived,
                flops=flops,
            )
            flops = 0  # the call's FLOPs go on its first output only
            if phase == "backward":
                self._node_of[handle] = id(torch._C._current_autograd_node())
            self._attach(storage, handle)

    def _op_device(self, inputs: list) -> str:
        """Where an op runs: the book's target when one is set, else the GPU when an input is
        on it."""
        if self.book.target is not None:
            return self.book.target
        return GPU if any(self.book.device_of(t) == GPU for t in inputs) else HOST

    def _attach(self, storage: torch.UntypedStorage, handle: int) -> None:
        self._handles[storage] = handle
        self._refs[handle] = self._refs.get(handle, 0) + 1
        weakref.finalize(storage, self._release, handle)

    def _release(self, handle: int) -> None:
        self._refs[handle] -= 1
        if self._refs[handle] == 0:
            del self._refs[handle]
            self._free(handle)

    def _accumulates_in_place(self, func, args: tuple, out: Any) -> bool:
        """Whether this is autograd summing two gradients for one input, which a GPU run does
        in place (``old_var.add_(var)`` in ``InputBuffer::accumulate``) but a fake one cannot:
        the engine never accumulates in place into a tensor subclass."""
        if func is not torch.ops.aten.add.Tensor or torch.is_grad_enabled() or len(args) != 2:
            return False
        old, new = args
        if not (
            isinstance(old, torch.Tensor)
            and isinstance(new, torch.Tensor)
            and isinstance(out, torch.Tensor)
        ):
            return False
        if old.shape != new.shape or old.shape != out.shape or old.dtype != out.dtype:
            return False
        handle = self._handles.get(old.untyped_storage(), 0)
        if not handle or old.untyped_storage().nbytes() != old.numel() * old.element_size():
            return False
        if not old.is_contiguous():
            return False
        # a gradient that another node produced: a formula's own sums are not accumulations
        return self._node_of.get(handle) != id(torch._C._current_autograd_node())

    def _alias(self, storage: torch.UntypedStorage, existing: torch.UntypedStorage) -> None:
        handle = self._handles[existing]
        self.book.book(storage, GPU)
        self._attach(storage, handle)

    def _is_state(self, tensor: torch.Tensor) -> bool:
        try:
            return self._handles.get(tensor.untyped_storage(), 0) in self._state_handles
        except (RuntimeError, NotImplementedError):
            return False

    def _record(
        self,
        *,
        nbytes: int,
        phase: str,
        op: str,
        shape: tuple,
        dtype: str,
        state_derived: bool = False,
        category: str = "temporaries",
        flops: int = 0,
    ) -> int:
        module = self.context.module(phase)
        source = None
        if module is None and phase in ("forward", "other"):
            source = _user_source()
        elif module is None and phase == "backward":
            source = self.context.backward_source()
        self.records.append(
            _Record(
                nbytes=nbytes,
                category=category,
                phase=phase,
                step=self.context.step,
                module=module,
                op=op,
                shape=shape,
                dtype=dtype,
                recompute=phase == "backward" and bool(self.context.module_stack),
                source=source,
                state_derived=state_derived,
                call=self._num_calls,
                flops=flops,
            )
        )
        handle = len(self.records)
        self.events.append(handle)
        return handle

    def _free(self, handle: int) -> None:
        self.events.append(-handle)

    def annotate_result(self, result: Any) -> None:
        """Label the autograd nodes behind a torch call's result with the module (or the step's
        source line) that made them, so backward allocations can be attributed. Autograd sets
        ``grad_fn`` above the dispatcher, so this runs at the torch-function level; it walks
        back through nodes made inside composite calls until it meets labelled ones."""
        if not torch.is_grad_enabled() or self.context.phase() != "forward":
            return
        module = self.context.module("forward")
        label = (_NODE_KEY, module) if module is not None else None
        pending = []
        for tensor in tree_flatten(result)[0]:
            if isinstance(tensor, torch.Tensor) and tensor.grad_fn is not None:
                pending.append(tensor.grad_fn)
        while pending:
            node = pending.pop()
            metadata = node.metadata
            if _NODE_KEY in metadata or _NODE_SOURCE_KEY in metadata:
                continue
            if label is None:
                label = (_NODE_SOURCE_KEY, _user_source())
            metadata[label[0]] = label[1]
            pending.extend(
                next_node for next_node, _ in node.next_functions if next_node is not None
            )

    def _add_workspaces(
        self, func, args: tuple, kwargs: dict, out: Any, inputs: list, phase: str
    ) -> None:
        thread = "autograd" if phase == "backward" else "main"
        if func._schema.name in kernels.GPU_ONLY and self._op_device(inputs) != GPU:
            return  # a host op takes no kernel buffer from the GPU's allocator
        found = kernels.workspaces(
            self.kernel_model, func, args, out, thread, self._workspace_owners, kwargs
        )
        transient = []
        for workspace in found:
            handle = self._record(
                nbytes=workspace.nbytes,
                phase=phase,
                op=workspace.label,
                shape=(workspace.nbytes,),
                dtype="uint8",
                category="workspace",
            )
            if not workspace.persistent:
                transient.append(handle)
        for handle in transient:
            self._free(handle)

    # --- labels -----------------------------------------------------------------------------

    def relabel(
        self, tensor: torch.Tensor | None, category: str, module: str | None = None
    ) -> None:
        """Give the storage of ``tensor`` a category (and module) that its allocation site does
        not tell: a parameter, a gradient, optimizer state."""
        if tensor is None:
            return
        handle = self._handles.get(tensor.untyped_storage(), 0)
        if not handle:
            return
        record = self.records[handle - 1]
        record.category = category
        if module is not None:
            record.module = module
        if category == "optimizer":
            self._state_handles.add(handle)

    def label_inputs_after_build(self) -> None:
        """Storages the factory made and kept that are not parameters or buffers."""
        live = _live_handles(self.events)
        for handle in live:
            record = self.records[handle - 1]
            if record.category == "temporaries":
                record.category = "inputs"

    def record_loss(self, call: LossCall) -> None:
        self.losses.append(call)

    def finish(self, num_steps: int, num_parameters: int) -> Trace:
        """Freeze the trace; forward allocations alive when backward began are activations."""
        freed_at: dict[int, int] = {}
        for index, event in enumerate(self.events):
            if event < 0:
                freed_at[-event] = index
        for handle, record in enumerate(self.records, start=1):
            if record.category != "temporaries" or record.phase != "forward":
                continue
            start = self.backward_starts.get(record.step)
            if start is None:
                continue
            if freed_at.get(handle, len(self.events)) > start:
                record.category = "activations"
        assumptions = list(self.assumptions)
        if self.shadow is not None:
            assumptions.extend(self.shadow.assumptions)
        return Trace(
            allocations=tuple(record.freeze() for record in self.records),
            events=tuple(self.events),
            backward_starts=tuple(self.backward_starts.get(step, -1) for step in range(num_steps)),
            num_steps=num_steps,
            sdpa_calls=tuple(self.sdpa_calls),
            losses=tuple(self.losses),
            assumptions=tuple(dict.fromkeys(assumptions)),
            num_parameters=num_parameters,
        )


def _live_handles(events: list[int]) -> list[int]:
    live: dict[int, None] = {}
    for event in events:
        if event > 0:
            live[event] = None
        else:
            live.pop(-event, None)
    return list(live)


def _user_source() -> str | None:
    """``file:line`` of the innermost frame of the user's code (:mod:`levers.user_code`)."""
    frame = sys._getframe(2)
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def install_module_hooks(context: SiteContext, names: dict[int, str]) -> Callable[[], None]:
    """Track the module stack with global forward hooks; returns the function that removes them."""

    def pre_hook(module: torch.nn.Module, args: Any) -> None:
        context.module_stack.append(names.get(id(module), f"<{type(module).__name__}>"))

    def post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        if context.module_stack:
            context.module_stack.pop()

    # compiled modules run without these: dynamo would trace them and guard on the stack
    setattr(pre_hook, SITE_HOOK, True)
    setattr(post_hook, SITE_HOOK, True)
    pre = module_api.register_module_forward_pre_hook(pre_hook)
    post = module_api.register_module_forward_hook(post_hook, always_call=True)

    def remove() -> None:
        pre.remove()
        post.remove()

    return remove


def install_optimizer_hooks(
    context: SiteContext,
    tracker: StorageTracker,
    optimizer: torch.optim.Optimizer | None,
    model: torch.nn.Module | None = None,
) -> Callable[[], None]:
    """Mark the optimizer phase and label optimizer state (with its parameter's module) after
    each step."""
    owners = {}
    if model is not None:
        owners = {id(p): name.rpartition(".")[0] for name, p in model.named_parameters()}

    def pre_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        context.in_optimizer = True

    def post_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        for parameter, state in opt.state.items():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    tracker.relabel(value, "optimizer", owners.get(id(parameter)))
        context.in_optimizer = False

    pre = register_optimizer_step_pre_hook(pre_hook)
    post = register_optimizer_step_post_hook(post_hook)

    def remove() -> None:
        pre.remove()
        post.remove()

    return remove


def install_gradient_hooks(tracker: StorageTracker, model: torch.nn.Module) -> Callable[[], None]:
    """Label each parameter's ``.grad`` as a gradient once autograd has accumulated it."""
    handles = []
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        module = name.rpartition(".")[0]

        def hook(param: torch.Tensor, module: str = module) -> None:
            tracker.relabel(param.grad, "gradients", module)

        handles.append(parameter.register_post_accumulate_grad_hook(hook))

    def remove() -> None:
        for handle in handles:
            handle.remove()

    return remove
