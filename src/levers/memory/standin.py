"""CPU fake tensors standing in for CUDA tensors.

Why not fake CUDA tensors? ``FakeTensorMode`` can make them only where torch was built with
CUDA: with a CPU-only build, moving a tensor to ``cuda``, initialising a parameter there or
running backward over it calls into CUDA's device guard and accelerator hooks, which such a
build does not have (the backward even aborts the process). So every workload runs on fake
*CPU* tensors, on any build, and this module keeps the illusion that they are on the GPU:

- Calls that name a CUDA device (``device="cuda"``, ``.to("cuda")``, ``.cuda()``, a
  ``torch.device("cuda")`` context) are rewritten to the CPU, and the tensors they create are
  booked as GPU memory in a :class:`DeviceBook`. A tensor copied to the host (``.cpu()``,
  ``.to("cpu")``) becomes a separate, host-booked copy, as on a GPU.
- To the workload's own code (not to torch's), a GPU-booked tensor reports ``device ==
  cuda:0`` and ``is_cuda``, so code that branches on the device takes the GPU branch.
- ``torch.Generator(device="cuda")`` gives a CPU generator that reports a CUDA device.

What CUDA would do differently from the CPU on the same tensors (the autocast op lists, the SDPA
kernels) is modelled in :mod:`levers.memory.autocast` and :mod:`levers.memory.sdpa`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.autograd
import torch.autograd.graph
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils.weak import WeakIdKeyDictionary

GPU = "cuda"
HOST = "host"
_CPU = torch.device("cpu")
_CUDA0 = torch.device("cuda", 0)
# What torch's own code sees as the device of a GPU-booked tensor: still the CPU (so its checks
# and kernels agree with the tensor), but with an index, so that a tensor it creates "on the
# same device" (``device=p.device``) is booked on the GPU too, as it would be in a GPU run.
_STANDIN_CPU = torch.device("cpu", 0)

# Code in these packages sees the true (CPU) device: it runs the fake tensors and the stand-in
# machinery themselves. Torch's public modules (torch.optim, torch.utils, torch.nn) see
# ``cpu:0`` for a GPU-booked tensor (see _STANDIN_CPU); everyone else sees ``cuda:0``.
_INTERNAL_PREFIXES = ("torch._", "levers.memory.")


class DeviceBook:
    """Which storages stand in for GPU memory. Unknown storages are host memory."""

    def __init__(self) -> None:
        self._devices: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._target = threading.local()

    def book(self, storage: torch.UntypedStorage, device: str) -> None:
        self._devices[storage] = device

    def device_of_storage(self, storage: torch.UntypedStorage) -> str:
        return self._devices.get(storage, HOST)

    def device_of(self, tensor: torch.Tensor) -> str:
        try:
            return self.device_of_storage(tensor.untyped_storage())
        except (RuntimeError, NotImplementedError):  # sparse or otherwise storage-less
            return HOST

    @property
    def target(self) -> str | None:
        """The device that the torch call being run asked for, if it named one."""
        return getattr(self._target, "value", None)

    @contextlib.contextmanager
    def targeting(self, device: str | None) -> Iterator[None]:
        previous = self.target
        self._target.value = device
        try:
            yield
        finally:
            self._target.value = previous


def _device_kind(value: Any) -> str | None:
    """GPU or HOST for something that names a device, else None."""
    if isinstance(value, torch.device):
        if value.type == "cuda" or value == _STANDIN_CPU:
            return GPU
        return HOST
    if isinstance(value, str):
        head = value.split(":")[0].strip()
        if head == "cuda" or value.strip() == "cpu:0":
            return GPU
        if head in ("cpu", "meta"):
            return HOST
        return None
    return None


def _caller_is_internal(depth: int) -> bool:
    """Whether the code ``depth`` frames above the caller of this function is torch's or ours."""
    module = sys._getframe(depth + 1).f_globals.get("__name__", "")
    return module == "torch" or module.startswith(("torch.", "levers.memory."))


def _reported_device(depth: int) -> torch.device | None:
    """The device to report for a GPU-booked tensor to the code ``depth`` frames up, or None
    for its true device."""
    module = sys._getframe(depth + 1).f_globals.get("__name__", "")
    if module == "torch" or module.startswith(_INTERNAL_PREFIXES):
        return None
    if module.startswith("torch."):
        return _STANDIN_CPU
    return _CUDA0


# a getter runs under __torch_function__, which runs under the code that read the attribute
_GETTER_DEPTH = 2


class StandInMode(TorchFunctionMode):
    """Rewrites CUDA device arguments to the CPU and answers device questions like a GPU would.

    ``interceptors`` maps a torch function to a handler ``(func, args, kwargs) -> result`` that
    runs instead of it (used for SDPA and losses); a handler returns ``NotImplemented`` to let
    the call through.
    """

    def __init__(
        self,
        book: DeviceBook,
        interceptors: dict[Callable, Callable] | None = None,
        observer: Callable[[Any], None] | None = None,
    ):
        super().__init__()
        self.book = book
        self.interceptors = interceptors or {}
        self.observer = observer  # sees every result (used to label autograd nodes)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        handler = self.interceptors.get(func)
        if handler is not None:
            result = handler(func, args, kwargs)
            if result is not NotImplemented:
                return self._observed(result)
        getter = _GETTERS.get(func)
        if getter is not None:
            return getter(self, func, args, kwargs)
        if func is torch.Tensor.cuda:
            return self._observed(self._move(args[0], GPU, kwargs.get("non_blocking", False)))
        if func is torch.Tensor.cpu:
            return self._observed(self._move(args[0], HOST, False))
        if func is torch.Tensor.to:
            return self._observed(self._to(func, args, kwargs))
        if func is torch._C._nn._parse_to:
            # Module.to(device=...) parses its arguments first: left as given, so that the
            # Tensor.to calls that follow name the GPU (and book the moved tensors there)
            return func(*args, **kwargs)
        target = _device_kind(kwargs.get("device"))
        if target is not None:
            kwargs["device"] = _CPU
        elif torch.get_default_device().type == "cuda" and _is_constructor(func):
            # a default device set before levers started injects cuda below this mode
            target, kwargs["device"] = GPU, _CPU
        with self.book.targeting(target):
            return self._observed(func(*args, **kwargs))

    def _observed(self, result: Any) -> Any:
        if self.observer is not None:
            self.observer(result)
        return result

    def _move(self, tensor: torch.Tensor, target: str, non_blocking: bool) -> torch.Tensor:
        if self.book.device_of(tensor) == target:
            return tensor
        with self.book.targeting(target):
            return tensor.to(_CPU, non_blocking=non_blocking, copy=True)

    def _to(self, func, args, kwargs) -> torch.Tensor:
        tensor, rest = args[0], list(args[1:])
        target = _device_kind(kwargs.get("device"))
        if target is not None:
            kwargs["device"] = _CPU
        for position, value in enumerate(rest):
            kind = _device_kind(value)
            if kind is not None:
                target, rest[position] = kind, _CPU
            elif isinstance(value, torch.Tensor):  # .to(other): other's device and dtype
                target = self.book.device_of(value)
        if target is not None and target != self.book.device_of(tensor):
            kwargs["copy"] = True
        with self.book.targeting(target):
            return func(tensor, *rest, **kwargs)


def _is_cuda_getter(mode: StandInMode, func, args, kwargs):
    result = func(*args, **kwargs)
    if _caller_is_internal(_GETTER_DEPTH):
        return result
    return mode.book.device_of(args[0]) == GPU


def _is_cpu_getter(mode: StandInMode, func, args, kwargs):
    result = func(*args, **kwargs)
    if _caller_is_internal(_GETTER_DEPTH):
        return result
    return mode.book.device_of(args[0]) != GPU


def _get_device(mode: StandInMode, func, args, kwargs):
    result = func(*args, **kwargs)
    if _caller_is_internal(_GETTER_DEPTH) or mode.book.device_of(args[0]) != GPU:
        return result
    return 0


class _GetterTable(dict):
    """Torch passes property getters as fresh method-wrappers: look them up by equality."""

    def get(self, func, default=None):
        for key, value in self.items():
            if func == key:
                return value
        return default


_GETTERS = _GetterTable(
    {
        torch.Tensor.is_cuda.__get__: _is_cuda_getter,
        torch.Tensor.is_cpu.__get__: _is_cpu_getter,
        torch.Tensor.get_device: _get_device,
    }
)


def _is_constructor(func) -> bool:
    return func in _device_constructors()


_ORIGINAL_GENERATOR = torch.Generator


class StandInGenerator(_ORIGINAL_GENERATOR):
    """A CPU generator that reports the device it was asked for (``cuda`` included)."""

    def __new__(cls, device: Any = "cpu") -> StandInGenerator:
        return super().__new__(cls)  # the C type would refuse a CUDA device here

    def __init__(self, device: Any = "cpu") -> None:
        super().__init__()
        self._levers_device = torch.device(device) if device is not None else _CPU

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        if _caller_is_internal(1):
            return _CPU
        return self._levers_device


@contextlib.contextmanager
def cuda_generators() -> Iterator[None]:
    """Make ``torch.Generator`` the :class:`StandInGenerator` class (a subclass, so that
    ``isinstance`` checks hold); undone on exit."""
    original = torch.Generator
    torch.Generator = StandInGenerator  # type: ignore[misc]
    try:
        yield
    finally:
        torch.Generator = original  # type: ignore[misc]


@contextlib.contextmanager
def cuda_capability(sm: tuple[int, int]) -> Iterator[None]:
    """Make ``torch.cuda.get_device_capability`` answer the predicted GPU's compute capability
    (a CPU-only build raises there): model code picks its kernels by it (transformers' mixture
    of experts takes ``grouped_mm`` from 8.0 on); undone on exit."""
    original = torch.cuda.get_device_capability

    def get_device_capability(device: Any = None) -> tuple[int, int]:
        return tuple(sm)  # type: ignore[return-value]

    torch.cuda.get_device_capability = get_device_capability  # type: ignore[assignment]
    _PREDICTED_CAPABILITY.append(tuple(sm))
    try:
        yield
    finally:
        _PREDICTED_CAPABILITY.pop()
        torch.cuda.get_device_capability = original  # type: ignore[assignment]


_PREDICTED_CAPABILITY: list[tuple[int, int]] = []


def predicted_capability() -> tuple[int, int] | None:
    """The compute capability of the GPU a memory prediction in progress is for (None outside
    one): a lever that applies by the GPU (float8) asks it instead of the machine's GPU."""
    return _PREDICTED_CAPABILITY[-1] if _PREDICTED_CAPABILITY else None


@contextlib.contextmanager
def fake_tensor_devices(book: DeviceBook) -> Iterator[None]:
    """Make ``FakeTensor.device`` (a Python property, which no torch function mode sees) report
    ``cuda:0`` for GPU-booked tensors to the workload's code and ``cpu:0`` to torch's public
    modules; undone on exit."""
    original = FakeTensor.__dict__.get("device")
    if not isinstance(original, property):  # a torch whose fake tensors report devices otherwise
        yield
        return

    def device(self: FakeTensor) -> torch.device:
        true_device = original.fget(self)
        if true_device.type != "cpu" or book.device_of(self) != GPU:
            return true_device
        return _reported_device(1) or true_device

    FakeTensor.device = property(device)  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        FakeTensor.device = original  # type: ignore[method-assign]


@contextlib.contextmanager
def fakes_as_real_to_transformers() -> Iterator[None]:
    """Make transformers take the prediction's fakes for the real tensors they stand for; undone
    on exit. It treats a fake tensor as a sign of tracing (``is_tracing``), and while tracing it
    builds the causal mask its SDPA path otherwise leaves to ``is_causal``: a [batch, 1, seq,
    seq] mask, which attention then takes as a bias and saves for backward, in every layer (on
    the llama 1b at batch 4, 0.5 GiB that the GPU never holds). The values it then reads (is
    every padding position real?) come from the step's shadows (:mod:`levers.memory.shadow`).
    Acts only when transformers is imported (call it after the workload is built)."""
    import_utils = sys.modules.get("transformers.utils.import_utils")
    original = getattr(import_utils, "is_fake_tensor", None)
    if original is None:
        yield
        return
    import_utils.is_fake_tensor = lambda tensor: False
    try:
        yield
    finally:
        import_utils.is_fake_tensor = original


@contextlib.contextmanager
def backward_in_mode(mode: TorchFunctionMode) -> Iterator[None]:
    """Run autograd's engine with ``mode`` on the torch-function mode stack; undone on exit.

    ``Tensor.backward``, ``torch.autograd.backward`` and ``torch.autograd.grad`` are torch
    functions: the mode sees them and, like any mode, runs them with itself off the stack, so
    the whole backward would run without the stand-in. Python that runs in backward would then
    see plain CPU tensors: hooks, custom autograd functions, and above all the forward that
    non-reentrant activation checkpointing recomputes, whose SDPA would run the CPU kernel
    instead of the target GPU's and save other tensors than the forward did (checkpoint's "A
    different number of tensors was saved"). Torch checks for torch functions before it calls
    ``_engine_run_backward``, so the mode is put back there, for the engine run only.
    """
    original = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if original is None:  # a torch without this seam: backward runs without the stand-in
        yield
        return

    def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        if mode in _torch_function_modes():
            return original(*args, **kwargs)
        with mode:
            return original(*args, **kwargs)

    torch.autograd.graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward
    try:
        yield
    finally:
        torch.autograd.graph._engine_run_backward = original
        torch.autograd._engine_run_backward = original


def _torch_function_modes() -> list[Any]:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


@contextlib.contextmanager
def swappable_fake_parameters(fake_mode) -> Iterator[None]:
    """Let ``Module.to()`` swap the parameters of a model built under a fake mode.

    ``Module._apply`` swaps fake parameters with ``torch.utils.swap_tensors``, which refuses
    tensors that have weak references, and the fake mode's memo keeps one to every parameter.
    Every tensor here is born fake, so the memo (used to convert real tensors consistently) can
    be dropped before each swap. Undone on exit.
    """
    original = torch.utils.swap_tensors

    def swap_tensors(t1: torch.Tensor, t2: torch.Tensor) -> None:
        converter = getattr(fake_mode, "fake_tensor_converter", None)
        memo = getattr(getattr(converter, "meta_converter", None), "tensor_memo", None)
        if memo is not None:
            memo.clear()
        original(t1, t2)

    torch.utils.swap_tensors = swap_tensors
    try:
        yield
    finally:
        torch.utils.swap_tensors = original
