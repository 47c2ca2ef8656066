"""The float64 reference of the parity steps: the baseline's workload run in float64.

Two runs of one training step in bf16 differ by more than a fixed tolerance can allow (a
correct compiled step under bf16 autocast drifts a few percent from eager in three Adam steps),
while a wrong change can differ by less. What tells them apart is the distance of each side to a
run of the same step in higher precision: a correct candidate is about as far from it as the
baseline is; a wrong one is farther. PyTorch's own compile accuracy checks judge compiled models
against a float64 run the same way.

The reference is the baseline's factory called again with the same seed (same weights, same
batches), its floating parameters and buffers cast to float64, and each of the parity steps run
with the global RNG reseeded as for the sides. Inside the step a torch-function mode casts every
floating tensor that reaches an op to float64 (batches the factory made in float32, targets,
``.float()`` and ``dtype=`` requests), except the tensor an in-place op writes to, so that a
mutation is never made on a copy, and except inside ``optimizer.step()``, whose tensors are
float64 by then and whose float32 step count CUDA's fused Adam reads as float32. Random draws (``torch.randn``, ``rand_like``, dropout masks)
run in the dtype the step asked for and are cast afterwards, since a float64 draw takes other
numbers from the generator (known limits: a ``*_like`` draw and a dropout mask are drawn as float32
would draw them, and attention's own ``dropout_p`` draws in float64). Autocast leaves float64 tensors alone, so a step that enters
``torch.autocast`` computes in float64 all the same; a compiled model runs eagerly
(``torch.compiler.set_stance("force_eager")``), since the reference is the eager math.

An op that has no float64 kernel (``torch._grouped_mm``, a mixture of experts' matmuls on a GPU)
runs in float32 on float32 copies of its inputs, its result cast back, and is named
(``Reference.float32_ops``): still far above the sides' bf16.

A reference that cannot be made says why and the gate falls back to the fixed tolerances: a
device without float64 (MPS), a step that refuses float64 itself (a Triton or other fused kernel
written for bf16/fp32 and called outside a torch op), a module whose output is still not float64 (a workload that hard-codes
its dtype past the cast), a non-finite reference loss, or a reference that does not fit on the
device. It runs before the sides are built and is freed before they are, so its memory (twice an
fp32 side's weights, optimizer state and activations) never adds to theirs; its cost is one more
build and the parity steps in float64, never the timed steps.
"""

from __future__ import annotations

import gc
import math
import re
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

from levers.ab.gradnorm import grad_norm_probe
from levers.ab.killlines import Kill, KillLines, KillSignal, check_time
from levers.ab.steps import loss_of
from levers.workload import Workload

_LOWER_FLOATS = (torch.float16, torch.bfloat16, torch.float32)
# methods that ask for a lower float dtype by name
_DOWNCASTS = {torch.Tensor.float, torch.Tensor.half, torch.Tensor.bfloat16}
# methods whose dtype argument reinterprets bits rather than converting values
_BIT_VIEWS = {torch.Tensor.view}
# random draws: a float64 draw takes other numbers from the generator than the step's own, so
# they run as the step asked (its dtype) and only their result becomes float64
_DRAWS = {
    torch.randn,
    torch.rand,
    torch.normal,
    torch.randint,
    torch.randperm,
    torch.bernoulli,
    torch.multinomial,
    torch.poisson,
}
_DRAWS_LIKE = {torch.randn_like, torch.rand_like}
_DROPOUTS = {F.dropout, torch.dropout}
# random draws the cast leaves alone, only noted for Reference.draws_random: in place on a
# float64 tensor, or the other dropouts (a mask drawn in float64)
_IN_PLACE_DRAWS = {
    torch.Tensor.bernoulli_,
    torch.Tensor.uniform_,
    torch.Tensor.normal_,
    torch.Tensor.exponential_,
    torch.Tensor.random_,
}
_ANY_DROPOUT = {*_DROPOUTS, F.alpha_dropout, F.feature_alpha_dropout, F.dropout1d, F.dropout2d,
                F.dropout3d}
_MAX_REASON_CHARS = 200
# how a kernel refuses float64 ("not implemented for 'Double'", "... matrix, got Double")
_NO_FLOAT64_KERNEL = re.compile(r"Double|float64")


@dataclass(frozen=True)
class Reference:
    """The float64 run's loss and total gradient norm after each parity step, or why not."""

    losses: tuple[float | None, ...] = ()
    grad_norms: tuple[float | None, ...] = ()
    why_not: str | None = None  # None: the reference ran
    # whether the model's forward drew random numbers (dropout, a random op): a compiled side's
    # programs made with eager's random ops (levers.ab.random_alike) are then not the user's.
    # None: not known (no reference ran)
    draws_random: bool | None = None
    # ops that have no float64 kernel and ran in float32 in the float64 run (torch._grouped_mm)
    float32_ops: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        return self.why_not is None


def unavailable(why: str) -> Reference:
    return Reference(why_not=why)


def _to_float64(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype in _LOWER_FLOATS:
        return value.to(torch.float64)
    if isinstance(value, torch.dtype) and value in _LOWER_FLOATS:
        return torch.float64
    return value


def _to_float32(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.to(torch.float32)
    if value is torch.float64:
        return torch.float32
    return value


def _writes_first_argument(func: Callable[..., Any]) -> bool:
    name = getattr(func, "__name__", "")
    in_place = name.endswith("_") and not name.startswith("__")
    return in_place or name in ("__setitem__", "__iadd__", "__isub__", "__imul__", "__itruediv__")


class Float64Mode(TorchFunctionMode):
    """Every floating tensor and dtype that reaches a torch op becomes float64, except inside an
    optimizer's ``step()`` (see :func:`optimizer_steps_outside`)."""

    def __init__(self) -> None:
        super().__init__()
        self.suspended = 0  # > 0 while an optimizer steps
        self.in_model = 0  # > 0 while the model's forward runs (set by _model_calls)
        self.drew_in_model = False  # a random number was drawn there
        self.float32_ops: set[str] = set()  # ops with no float64 kernel, run in float32

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.suspended:
            return func(*args, **kwargs)
        if self.in_model and not self.drew_in_model and _draws(func, args, kwargs):
            self.drew_in_model = True
        if func in _DOWNCASTS:
            return args[0].to(torch.float64)
        if func in _BIT_VIEWS:
            return func(*args, **kwargs)
        if func in _DRAWS:
            return _to_float64(func(*args, **kwargs))
        if func in _DRAWS_LIKE:
            # the input is float64 by now: draw as a float32 step would
            kwargs.setdefault("dtype", torch.float32)
            return _to_float64(func(*args, **kwargs))
        if func in _DROPOUTS:
            return _dropout(*args, **kwargs)
        out = kwargs.pop("out", None)
        if args and _writes_first_argument(func):
            # an in-place op writes to its first argument: casting it would mutate a copy
            args = (args[0], *tree_map(_to_float64, tuple(args[1:])))
        else:
            args = tree_map(_to_float64, tuple(args))
        kwargs = tree_map(_to_float64, kwargs)
        if out is not None:
            kwargs["out"] = out
        try:
            return func(*args, **kwargs)
        except (RuntimeError, NotImplementedError) as exc:
            in_place = out is not None or bool(args) and _writes_first_argument(func)
            if in_place or not _NO_FLOAT64_KERNEL.search(str(exc)):
                raise
        # no float64 kernel (torch._grouped_mm, a mixture of experts' matmul): this op alone
        # computes in float32, still far above the sides' bf16, and its result is cast back
        self.float32_ops.add(getattr(func, "__name__", str(func)))
        low = tree_map(_to_float32, (args, kwargs))
        return tree_map(_to_float64, func(*low[0], **low[1]))


def _draws(func: Callable[..., Any], args: tuple, kwargs: dict) -> bool:
    """Whether this call draws random numbers (a dropout of p > 0 in training, included)."""
    if func in _ANY_DROPOUT:
        p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
        training = kwargs.get("training", args[2] if len(args) > 2 else True)
        return bool(training) and float(p) > 0.0
    if func is F.scaled_dot_product_attention:
        p = kwargs.get("dropout_p", args[4] if len(args) > 4 else 0.0)
        return float(p) > 0.0
    return func in _DRAWS or func in _DRAWS_LIKE or func in _IN_PLACE_DRAWS


@contextmanager
def _model_calls(mode: Float64Mode, model: torch.nn.Module) -> Iterator[None]:
    """Count the model's forward calls on ``mode`` (its random draws there are noted)."""

    def enter(*_: Any) -> None:
        mode.in_model += 1

    def leave(*_: Any) -> None:
        mode.in_model = max(mode.in_model - 1, 0)

    handles = (model.register_forward_pre_hook(enter), model.register_forward_hook(leave))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def optimizer_steps_outside(mode: Any) -> Iterator[None]:
    """Let every ``Optimizer.step()`` run outside ``mode`` (any mode that passes its calls
    through while its ``suspended`` count is above 0).

    For :class:`Float64Mode`: its parameters, gradients and moments are float64 by then, so the cast has nothing to do
    there, and it would change what the optimizer keeps as it is: the step count, which the
    optimizer makes as a float32 scalar (``torch.tensor(0.0, dtype=float32)``), would be made in
    float64, and CUDA's fused Adam and AdamW kernels read that count through a ``float*``. The
    low half of a float64 1.0 reads as 0.0, the bias correction ``1 - beta ** 0`` is 0, and the
    reference's parameters turn NaN after its first update (every model with ``fused=True`` on
    an H200; a CPU's fused kernel reads the count otherwise, so it stayed finite there).
    """

    def pause(*_: Any) -> None:
        mode.suspended += 1

    def resume(*_: Any) -> None:
        mode.suspended = max(mode.suspended - 1, 0)

    handles = (register_optimizer_step_pre_hook(pause), register_optimizer_step_post_hook(resume))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _dropout(
    input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
) -> torch.Tensor:
    """Dropout with the mask a float32 step draws (same generator state, same numbers)."""
    if not training or p == 0.0:
        return input
    mask = F.dropout(torch.ones_like(input, dtype=torch.float32), p, True).to(input.dtype)
    return input.mul_(mask) if inplace else input * mask


def _device_has_float64(device: torch.device) -> str | None:
    try:
        torch.zeros(1, dtype=torch.float64, device=device).sum().item()  # sync point (untimed)
    except (RuntimeError, TypeError) as exc:
        return f"the device {device} has no float64 ({_short(exc)})"
    return None


def _short(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


@contextmanager
def _output_dtype_watch(model: torch.nn.Module) -> Iterator[list[str]]:
    """Yield a list that receives 'module -> dtype' for the first module output not in float64."""
    seen: list[str] = []
    names = {id(m): name or "the model" for name, m in model.named_modules()}

    def hook(module: torch.nn.Module, args: object, output: object) -> None:
        if seen:
            return
        for leaf in torch.utils._pytree.tree_leaves(output):
            if isinstance(leaf, torch.Tensor) and leaf.dtype in _LOWER_FLOATS:
                seen.append(f"{names.get(id(module), type(module).__name__)} -> {leaf.dtype}")
                return

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def _force_eager():
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else nullcontext()


def _not_float64(workload: Workload) -> str | None:
    """Why the optimizer would still update lower-precision tensors, if it would."""
    if workload.optimizer is None:
        return None
    for group in workload.optimizer.param_groups:
        for param in group["params"]:
            if param.dtype in _LOWER_FLOATS:
                return (
                    f"the optimizer holds a {param.dtype} parameter that is not in the model "
                    "(model.to(torch.float64) cannot reach it)"
                )
    return None


def run_reference(
    build: Callable[[], Workload], *, num_steps: int, seed: int, lines: KillLines | None = None
) -> tuple[Reference, Kill | None]:
    """Build the baseline again, run ``num_steps`` parity steps in float64, and free it.

    ``build`` must seed and build as the runner does for a side (same weights). A kill line
    (the time budget) that fires during the reference is returned as the run's kill.
    """
    if num_steps <= 0:
        return unavailable("no parity steps"), None
    workload: Workload | None = None
    try:
        workload = build()
        why = _device_has_float64(torch.device(workload.device))
        if why:
            return unavailable(why), None
        if workload.optimizer is not None and workload.optimizer.state:
            why = "the factory's optimizer has already stepped (its state is not float64)"
            return unavailable(why), None
        workload.model.to(torch.float64)
        why = _not_float64(workload)
        if why:
            return unavailable(why), None
        return _steps(workload, num_steps, seed, lines)
    except KillSignal as signal:
        return unavailable("the run was stopped during the reference"), signal.kill
    except KeyboardInterrupt:
        raise
    except torch.OutOfMemoryError as exc:
        return unavailable(f"the float64 run does not fit on the device ({_short(exc)})"), None
    except Exception as exc:  # an op without a float64 kernel, a factory that insists on a dtype
        return unavailable(f"the float64 run failed ({_short(exc)})"), None
    finally:
        del workload
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _steps(
    workload: Workload, num_steps: int, seed: int, lines: KillLines | None
) -> tuple[Reference, Kill | None]:
    losses: list[float | None] = []
    norms: list[float | None] = []
    drew = False
    in_float32: set[str] = set()
    with ExitStack() as stack:
        take = stack.enter_context(grad_norm_probe(workload.model))
        lower = stack.enter_context(_output_dtype_watch(workload.model))
        stack.enter_context(_force_eager())
        for step in range(1, num_steps + 1):
            if lines is not None:
                check_time(lines, "parity", "reference", step)
            torch.manual_seed(seed + step)  # the same batches and dropout as the sides' k-th step
            mode = Float64Mode()
            with mode, optimizer_steps_outside(mode), _model_calls(mode, workload.model):
                loss = loss_of(workload.step())
            drew = drew or mode.drew_in_model
            in_float32.update(mode.float32_ops)
            if isinstance(loss, torch.Tensor) and loss.dtype in _LOWER_FLOATS:
                return unavailable(f"the step's loss is {loss.dtype}, not float64"), None
            if lower:
                return unavailable(
                    f"a module still computes in low precision ({lower[0]}): the workload "
                    "hard-codes its dtype"
                ), None
            value = None if loss is None else float(loss)  # sync point (the reference is untimed)
            if value is not None and not math.isfinite(value):
                return unavailable(f"the float64 loss is {value} at step {step}"), None
            norm = take()
            losses.append(value)
            norms.append(None if norm is None else float(norm))  # sync point
    return Reference(
        tuple(losses), tuple(norms), draws_random=drew, float32_ops=tuple(sorted(in_float32))
    ), None
