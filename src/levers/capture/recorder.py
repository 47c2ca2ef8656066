"""The op recorder: a ``TorchDispatchMode`` that records every aten op of one step.

For each op it records shapes, dtypes, bytes, FLOPs, the phase, the module and the user source
line. Attribution works like this:

- forward: the module is the innermost module running (global module forward hooks keep a
  stack); the source line is the innermost user frame.
- backward: the autograd engine runs one node at a time (``torch._C._current_autograd_node``).
  Each forward op tags the ``grad_fn`` of its outputs with its own index (in the node's
  ``metadata`` dict), so a backward op inherits the module and source line of the forward op
  that created its node. Gradient accumulation into a parameter is attributed to the module that
  owns the parameter. Ops re-run by activation checkpointing are attributed like forward ops and
  flagged ``recompute``.
- optimizer: between optimizer step pre/post hooks (and inside ``zero_grad``); the module is
  the one owning the parameter when an op touches exactly one, else None.

Nothing here changes what an op computes: every op is called with its own arguments and its
result is returned untouched.
"""

from __future__ import annotations

import dataclasses
import sys
import time
import weakref
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from levers.capture.ops import (
    MetaCache,
    op_flops,
    op_info,
    op_infos_by_id,
    tensors_in,
    tensors_in_call,
)
from levers.capture.records import CallRecord, OpRecord, SourceLoc, frozen_record
from levers.capture.source import in_checkpoint_recompute, user_frame

_TAG = "levers_op"  # key in autograd Node.metadata: the index of the forward op that made it
_PROGRESS_EVERY_S = 0.2
# an op's row: (index, OpInfo, phase, module, source, tensor_key of each input, of each output,
# flops, start and end perf_counter, live bytes, forward_op, autograd node name, recompute)
_INFO, _MODULE, _SOURCE = 1, 3, 4
_Tensor = torch.Tensor
_perf_counter = time.perf_counter
_weakref = weakref.ref
_getframe = sys._getframe
_current_graph_task_id = torch._C._current_graph_task_id
_current_autograd_node = torch._C._current_autograd_node
_containers = (tuple, list, dict)
_is_grad_enabled = torch.is_grad_enabled
# one C call that says whether any autocast is on (absent on some versions: then always ask)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


class CaptureInternalError(RuntimeError):
    """levers failed while recording an op; the user's step is not at fault."""


class LiveStorages:
    """Tracks the bytes of live tensor storages (the CPU stand-in for the allocator's counters)."""

    def __init__(self) -> None:
        self.live_bytes = 0
        self._refs: dict[int, weakref.ref] = {}  # id(storage) -> weak reference to it
        self._sizes: dict[weakref.ref, tuple[int, int]] = {}  # reference -> (id, bytes)
        self._on_free = self._freed  # bound once; every reference calls it

    def track(self, t: torch.Tensor) -> None:
        self.track_all([t])

    def track_all(self, tensors: list[torch.Tensor]) -> int:
        """Track the storages of ``tensors`` not tracked yet, until they are freed; the live
        bytes after."""
        refs = self._refs
        for t in tensors:
            if t.is_meta or t.is_sparse:
                continue
            storage = t.untyped_storage()
            key = id(storage)
            known = refs.get(key)
            if known is not None and known() is storage:
                continue
            size = storage.nbytes()
            self.live_bytes += size
            ref = _weakref(storage, self._on_free)
            refs[key] = ref
            self._sizes[ref] = (key, size)
        return self.live_bytes

    def _freed(self, ref: weakref.ref) -> None:
        key, size = self._sizes.pop(ref)
        self.live_bytes -= size
        self._refs.pop(key, None)


class OpRecorder(TorchDispatchMode):
    """Records aten ops; see the module docstring for how each field is attributed."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        optimizer: torch.optim.Optimizer | None = None,
        live: LiveStorages | None,
        range_marker: Callable[[int], Any] | None = None,
        progress: Callable[[int, str], None] | None = None,
    ) -> None:
        super().__init__()
        # one tuple per op, as _dispatch reads it (see _INFO above); build_ops makes the records
        self._rows: list[tuple] = []
        self._metas = MetaCache()
        self.num_recomputed = 0
        self.calls: list[CallRecord] = []
        self.phase = "forward"
        self.module_stack: list[torch.nn.Module] = []
        self.module_path: str | None = None  # current_module(), kept by push/pop_module
        self.paused = False
        self.live = live
        self.range_marker = range_marker
        self.progress = progress
        self._last_progress = time.perf_counter()
        self.t_start = self._last_progress  # ops' start_us count from here
        self._seen_backward = False
        self.autocast_seen: set[str] = set()  # "cuda:bfloat16" for every autocast state seen
        self._autocast_states: set[tuple[str, torch.dtype]] = set()
        self._in_optimizer = 0
        # (weak reference to an output, index of the op that made it) of the latest op, until
        # the next op tags the output's grad_fn (autograd sets it after this mode returns). Weak:
        # a strong reference would change how the autograd engine treats the tensor (it steals
        # a gradient that nothing else holds and detaches one that something does)
        self._pending: list[tuple[weakref.ref, int]] = []
        self._loss_targets: list[tuple[int, torch.Tensor, int]] = []
        self._module_paths = {id(m): name for name, m in model.named_modules()}
        self._param_owner = {
            id(p): mod_name
            for mod_name, mod in model.named_modules()
            for p in mod.parameters(recurse=False)
        }
        if optimizer is not None:  # optimizer state belongs to the module owning its parameter
            for param, state in optimizer.state.items():
                owner = self._param_owner.get(id(param))
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        self._param_owner[id(value)] = owner

    # --- state driven by hooks -------------------------------------------------------------

    @property
    def num_ops(self) -> int:
        return len(self._rows)

    def push_module(self, module: torch.nn.Module, *_: Any) -> None:
        self.module_stack.append(module)
        path = self._module_paths.get(id(module))
        if path is not None:
            self.module_path = path
        if not self.paused:
            self.note_autocast()  # a module call samples the autocast state its ops run under

    def pop_module(self, module: torch.nn.Module, *_: Any) -> None:
        # pop the innermost frame of this module (forward hooks always pair, checkpoint included)
        for i in range(len(self.module_stack) - 1, -1, -1):
            if self.module_stack[i] is module:
                del self.module_stack[i]
                break
        self.module_path = self.current_module()

    def enter_optimizer(self, *_: Any) -> None:
        self._in_optimizer += 1

    def exit_optimizer(self, *_: Any) -> None:
        self._in_optimizer -= 1

    def current_phase(self) -> str:
        if _current_graph_task_id() != -1:
            self._seen_backward = True
            return "backward"
        if self._in_optimizer:
            return "optimizer"
        return "other" if self._seen_backward else "forward"

    def current_module(self) -> str | None:
        """The path of the innermost running module of the model (``module_path`` is this,
        kept up to date by the module hooks so that an op reads it without a walk)."""
        for module in reversed(self.module_stack):
            path = self._module_paths.get(id(module))
            if path is not None:
                return path
        return None

    def note_autocast(self) -> None:
        """Record the autocast state. Called above the dispatcher (below it the autocast keys are
        excluded and autocast always reads as off): when a module is called and, from the
        function mode, for the calls it records (losses, attention, norms, syncs), which run
        outside modules too; sampled there rather than at every torch call, which costs
        microseconds per op."""
        if not _any_autocast():
            return
        for device_type in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device_type):
                state = (device_type, torch.get_autocast_dtype(device_type))
                if state not in self._autocast_states:
                    self._autocast_states.add(state)
                    self.autocast_seen.add(f"{device_type}:{str(state[1]).removeprefix('torch.')}")

    # --- recording ---------------------------------------------------------------------------

    def _tag_pending(self) -> None:
        """Tag the grad_fn of recent outputs with the op that produced them."""
        for ref, index in self._pending:
            t = ref()
            if t is None:
                continue
            node = t.grad_fn
            if node is not None and _TAG not in node.metadata:
                node.metadata[_TAG] = index
        self._pending.clear()

    def _backward_attribution(
        self,
    ) -> tuple[str | None, SourceLoc | None, int | None, str | None, bool]:
        """(module, source, forward_op, node name, recompute) of an op run in backward."""
        if self.module_stack and in_checkpoint_recompute():  # the stack walk only when it can be
            return self.module_path, user_frame(), None, None, True
        node = _current_autograd_node()
        if node is None:
            return None, None, None, None, False
        node_name = node.name()
        forward_index = node.metadata.get(_TAG)
        if forward_index is not None:
            fwd = self._rows[forward_index]
            return fwd[_MODULE], fwd[_SOURCE], forward_index, node_name, False
        variable = getattr(node, "variable", None)  # AccumulateGrad nodes hold their parameter
        if variable is not None:
            return self._param_owner.get(id(variable)), None, None, node_name, False
        return None, None, None, node_name, False

    def _optimizer_module(self, inputs: list[torch.Tensor]) -> str | None:
        owners = {self._param_owner.get(id(t)) for t in inputs} - {None}
        return owners.pop() if len(owners) == 1 else None

    def _dispatch(self, func, types, args=(), kwargs=None):
        """Run the op and append its row.

        This runs for every op of the step, so it does only what must be read while the op
        runs, and leaves the rest to ``build_ops`` after the step: each tensor's (shape, dtype,
        device) is kept as read (no tensor is held: that would change the step's memory) and
        turned into metas and bytes later; the source line, module and autograd node are read
        here because the stack, the module hooks' state and the node are gone afterwards.
        """
        info = op_infos_by_id.get(id(func)) or op_info(func)
        if self.paused or info.is_profiler:
            return func(*args, **(kwargs or {}))
        if kwargs is None:
            kwargs = {}
        if self._pending:
            self._tag_pending()
        index = len(self._rows)
        # current_phase(), inlined (a method call per op): keep the two alike
        if _current_graph_task_id() != -1:
            self._seen_backward = True
            phase = "backward"
        elif self._in_optimizer:
            phase = "optimizer"
        else:
            phase = "other" if self._seen_backward else "forward"
        call = info.call
        t0 = _perf_counter()
        if self.range_marker is not None:
            with self.range_marker(index):
                out = call(*args, **kwargs)
        else:
            out = call(*args, **kwargs)
        t1 = _perf_counter()
        try:
            # tensor_key of each tensor argument (as tensors_in_call(args, kwargs) finds them)
            input_keys = []
            walk_lists = info.lists_may_hold_tensors  # else lists of ints (sizes, dims): skipped
            for x in args:
                if isinstance(x, _Tensor):
                    input_keys.append((x.shape, x.dtype, x.device))
                elif walk_lists and isinstance(x, _containers):
                    input_keys += [(t.shape, t.dtype, t.device) for t in tensors_in(x)]
            if kwargs:
                input_keys += [(t.shape, t.dtype, t.device) for t in tensors_in(kwargs)]
            if isinstance(out, _Tensor):
                outputs = [out]
                output_keys = [(out.shape, out.dtype, out.device)]
            else:
                outputs = tensors_in(out)
                output_keys = [(t.shape, t.dtype, t.device) for t in outputs]
            forward_op = node_name = None
            recompute = False
            if phase == "backward":
                module, source, forward_op, node_name, recompute = self._backward_attribution()
            elif phase == "optimizer":
                module = self._optimizer_module(tensors_in_call(args, kwargs))
                source = user_frame(_getframe(1))
            else:  # the walk starts above this frame
                module, source = self.module_path, user_frame(_getframe(1))
            live_bytes = None  # on a GPU: the allocator's figure, read from the profiler afterwards
            if self.live is not None:
                live_bytes = self.live.track_all(outputs)
            flops = op_flops(func, args, kwargs, out) if info.has_flops else 0
            self._rows.append((
                index, info, phase, module, source, input_keys, output_keys, flops, t0, t1,
                live_bytes, forward_op, node_name, recompute,
            ))
            if recompute:
                self.num_recomputed += 1
            if phase != "backward" and _is_grad_enabled():
                pending = self._pending
                for t in outputs:
                    pending.append((_weakref(t), index))
            if self.progress is not None and t0 - self._last_progress > _PROGRESS_EVERY_S:
                self._last_progress = t0
                self.progress(len(self._rows), phase)
        except Exception as exc:  # levers' own bookkeeping failed: not the user's step
            raise CaptureInternalError(f"levers could not record {func}: {exc!r}") from exc
        return out

    # torch wraps this (in TorchDispatchMode.__init_subclass__) so that dynamo never compiles
    # it: a step with compiled code needs that; see UnguardedOpRecorder for the others
    __torch_dispatch__ = _dispatch

    def build_ops(
        self,
        device_us: dict[int, float] | None = None,
        live_bytes: list[int | None] | None = None,
    ) -> list[OpRecord]:
        """The OpRecords of the step, with the device time and allocator bytes (per op index)
        that a GPU capture reads from the profiler after the step."""
        metas = self._metas
        ops = []
        for (index, info, phase, module, source, input_keys, output_keys, flops, t0, t1, live,
             forward_op, node_name, recompute) in self._rows:
            inputs, read_bytes = metas.of_keys(input_keys)
            outputs, write_bytes = metas.of_keys(output_keys)
            # first-order traffic: views move nothing; an allocation writes nothing yet
            if info.is_view:
                read_bytes = write_bytes = 0
            elif info.allocates_only:
                write_bytes = 0
            ops.append(frozen_record(OpRecord, {
                "index": index,
                "name": info.name,
                "phase": phase,
                "module": module,
                "source": source,
                "inputs": inputs,
                "outputs": outputs,
                "read_bytes": read_bytes,
                "write_bytes": write_bytes,
                "flops": flops,
                "wall_us": (t1 - t0) * 1e6,
                "device_us": None if device_us is None else device_us.get(index, 0.0),
                "live_bytes": live if live_bytes is None else live_bytes[index],
                "forward_op": forward_op,
                "autograd_node": node_name,
                "recompute": recompute,
                "is_view": info.is_view,
                "is_inplace": info.is_inplace,
                "start_us": (t0 - self.t_start) * 1e6,
            }))
        return ops

    def add_call(
        self,
        kind: str,
        name: str,
        args: dict[str, Any],
        first_op: int | None,
        last_op: int | None,
        source: SourceLoc | None,
        loss_target: torch.Tensor | None,
    ) -> None:
        """Record a high-level call (from the call recorder or a wrapped metric function)."""
        if self.paused:
            return
        self._tag_pending()
        index = len(self.calls)
        if kind == "sdpa" and first_op is not None:
            args["backend_ran"] = sdpa_backend_of(
                row[_INFO].name for row in self._rows[first_op : last_op + 1]
            )
        if loss_target is not None:
            self._loss_targets.append((index, loss_target, args.get("ignore_index", -100)))
        self.calls.append(
            CallRecord(
                index=index,
                kind=kind,
                name=name,
                phase=self.current_phase(),
                module=self.module_path,
                source=source,
                args=args,
                first_op=first_op,
                last_op=last_op,
            )
        )

    def release(self) -> None:
        """Forget the latest op's outputs (the step is over)."""
        self._pending.clear()

    def finish_calls(self) -> list[CallRecord]:
        """Fill in what could only be read after the step (ignored target fractions)."""
        self.paused = True  # the reads below are levers' own ops, not the step's
        self.release()
        calls = list(self.calls)
        for index, target, ignore_index in self._loss_targets:
            num_targets = target.numel()
            num_ignored = int((target == ignore_index).sum())  # sync point: after the step
            args = dict(calls[index].args)
            args["num_targets"] = num_targets
            args["num_ignored"] = num_ignored
            args["ignored_fraction"] = num_ignored / num_targets if num_targets else 0.0
            if num_ignored:
                args.update(_ignored_at_row_ends(target, ignore_index, num_ignored))
            calls[index] = dataclasses.replace(calls[index], args=args)
        self._loss_targets.clear()
        return calls


def _target_rows(target: torch.Tensor) -> torch.Tensor | None:
    """The loss's targets as rows [sequences, length]: a target of two or more dimensions by its
    last, a flat one by the shape of the tensor it views (``labels.view(-1)``: the labels'
    [batch, length]); None where the rows cannot be known."""
    if target.dim() >= 2:
        return target.reshape(-1, target.shape[-1])
    base = target._base
    if (base is None or base.dim() < 2 or base.numel() != target.numel()
            or not base.is_contiguous() or not target.is_contiguous()):
        return None
    return target.reshape(-1, base.shape[-1])


def _ignored_at_row_ends(target: torch.Tensor, ignore_index: int,
                         num_ignored: int) -> dict[str, int]:
    """Where the ignored targets lie in their rows (none where the rows cannot be known): the
    ones in the runs that begin or end a row (``edge_ignored``: padding lies there, and the
    causal shift's last target), the ones between a row's first and last real target
    (``inner_ignored`` of ``inner_targets``: a masked LM's unmasked tokens; the ``num_ignored``
    that are not at an end), and how many rows end in an ignored target
    (``rows_ending_ignored``)."""
    rows = _target_rows(target)
    if rows is None or rows.numel() == 0:
        return {}
    length = rows.shape[1]
    real = rows != ignore_index
    has_real = real.any(1)
    first = real.int().argmax(1)
    last = length - 1 - real.flip(1).int().argmax(1)
    leading = torch.where(has_real, first, torch.full_like(first, length))
    trailing = torch.where(has_real, length - 1 - last, torch.zeros_like(last))
    inner = torch.where(has_real, last - first + 1, torch.zeros_like(last))
    edge = int((leading + trailing).sum())  # sync point: after the step
    return {
        "num_rows": rows.shape[0],
        "row_length": length,
        "edge_ignored": edge,
        "inner_targets": int(inner.sum()),
        "inner_ignored": num_ignored - edge,  # every ignored target not in a run at an end
        "rows_ending_ignored": int((~real[:, -1]).sum()),
    }


class UnguardedOpRecorder(OpRecorder):
    """An OpRecorder without torch's per-op guard that keeps dynamo out of the handler (a few
    microseconds per op). Only for a process where dynamo has compiled nothing: the step has
    run (warm-up) without compiling, so no compiled frame can reach the handler."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    __torch_dispatch__ = OpRecorder._dispatch


def dynamo_has_compiled() -> bool:
    """Whether torch.compile has compiled any frame in this process."""
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return False
    try:
        from torch._dynamo.utils import counters

        return counters["frames"]["total"] > 0
    except Exception:  # noqa: BLE001 - an unknown dynamo: assume it compiled
        return True


def make_recorder(model: torch.nn.Module, *, guarded: bool = False, **kwargs: Any) -> OpRecorder:
    """The op recorder for a step: unguarded when nothing has been compiled (see
    :class:`UnguardedOpRecorder`); ``guarded`` keeps the guard anyway (a step that has not run
    yet may compile during the capture)."""
    cls = OpRecorder if guarded or dynamo_has_compiled() else UnguardedOpRecorder
    return cls(model, **kwargs)


_SDPA_BACKENDS = {
    "_scaled_dot_product_flash_attention": "FLASH_ATTENTION",
    "_scaled_dot_product_flash_attention_for_cpu": "FLASH_ATTENTION_CPU",
    "_scaled_dot_product_efficient_attention": "EFFICIENT_ATTENTION",
    "_scaled_dot_product_cudnn_attention": "CUDNN_ATTENTION",
    "_scaled_dot_product_attention_math": "MATH",
    "_scaled_dot_product_fused_attention_overrideable": "OVERRIDEABLE",
}


def sdpa_backend_of(op_names: Iterable[str]) -> str:
    """The SDPA backend an attention call dispatched to, from the names of the aten ops it ran."""
    for name in op_names:
        base = name.split(".")[1] if name.startswith("aten.") else name
        backend = _SDPA_BACKENDS.get(base)
        if backend is not None:
            return backend
    # the math path decomposes into matmul/softmax when its own op is not visible
    return "MATH"
