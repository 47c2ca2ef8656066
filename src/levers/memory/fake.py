"""Run a workload's factory and steps on fake tensors that stand in for a GPU, and record the
allocation trace.

Nothing is allocated for real: the factory builds its model under ``FakeTensorMode``, so a
Llama-8B-shaped model "exists" on a laptop, and every op runs its meta kernel. Around it:

- :mod:`levers.memory.standin` makes the CPU fakes pass for CUDA tensors (why CPU fakes: see
  there), so the factory takes its GPU code paths (bf16 autocast, fused AdamW, ...);
- :mod:`levers.memory.autocast` applies CUDA's autocast lists;
- :mod:`levers.memory.sdpa` runs the attention kernel the target GPU would pick;
- :mod:`levers.memory.shadow` keeps the values of token ids, masks and indices;
- :mod:`levers.memory.tracker` records what is allocated and freed, where;
- :mod:`levers.memory.compiled` compiles what the workload compiles as inductor partitions it.

The factory is called with ``device="cuda"`` unless the caller set a device. Optimizers whose
``foreach`` was left to torch get ``foreach=True``, which is what torch picks for CUDA tensors
(it cannot tell that a fake tensor stands in for one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from levers.errors import LeversError
from levers.memory import compiled, sdpa
from levers.memory.autocast import cuda_autocast_policy
from levers.memory.composites import cuda_composites
from levers.hardware import GpuSpec
from levers.memory.kernels import KernelModel
from levers.memory.shadow import ShadowValues
from levers.memory.standin import (
    HOST,
    DeviceBook,
    StandInMode,
    backward_in_mode,
    cuda_capability,
    cuda_generators,
    fake_tensor_devices,
    fakes_as_real_to_transformers,
    swappable_fake_parameters,
)
from levers.memory.trace import LossCall, Trace
from levers.memory.tracker import (
    SiteContext,
    StorageTracker,
    install_gradient_hooks,
    install_module_hooks,
    install_optimizer_hooks,
)
from levers.memory.steps import DEFAULT_NUM_STEPS
from levers.workload import Workload


def with_gpu_device(factory: Callable[..., Any], params: dict[str, Any]) -> dict[str, Any]:
    """``params`` plus ``device="cuda"`` when the factory takes a device and none was given."""
    if "device" in params:
        return dict(params)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return dict(params)
    takes_device = "device" in signature.parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values()
    )
    return {**params, "device": "cuda"} if takes_device else dict(params)


def trace_workload(
    build: Callable[[], Workload],
    gpu: GpuSpec,
    *,
    num_steps: int = DEFAULT_NUM_STEPS,
    transform: Callable[[Workload], None] | None = None,
    kernel_model: KernelModel | None = None,
    default_device: str | None = None,
) -> tuple[Trace, Workload]:
    """Build the workload with ``build()`` and run ``num_steps`` steps on stand-in fakes.

    ``transform`` (optional) changes the built workload before its first step (a what-if).
    ``default_device`` ("cuda"), for a factory that takes no device: the build and the steps
    run under ``torch.device(default_device)``, so the tensors they create count as GPU memory.
    Returns the trace and the (fake) workload, whose tensors hold no memory.

    Raises:
        LeversError: trained parameters stayed in host memory, so the prediction would leave
            them (their gradients and optimizer state) out of the GPU's peak.
    """
    book = DeviceBook()
    context = SiteContext()
    shadow = ShadowValues()
    tracker = StorageTracker(book, context, kernel_model or KernelModel.for_gpu(gpu), shadow)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    interceptors = {
        F.scaled_dot_product_attention: _sdpa_handler(tracker, sdpa.target_for(gpu.sm)),
        F.cross_entropy: _loss_handler(tracker, shadow),
        torch.histc: _integer_histc,
        torch._grouped_mm: _grouped_mm_any_dtype,
    }
    removers: list[Callable[[], None]] = []
    with contextlib.ExitStack() as stack:
        stack.enter_context(cuda_autocast_policy())
        stack.enter_context(cuda_composites(book))
        stack.enter_context(cuda_generators())
        stack.enter_context(cuda_capability(gpu.sm))
        stack.enter_context(swappable_fake_parameters(fake_mode))
        stack.enter_context(fake_tensor_devices(book))
        stack.enter_context(fake_mode)
        stack.enter_context(tracker)
        standin = StandInMode(book, interceptors, observer=tracker.annotate_result)
        stack.enter_context(standin)
        stack.enter_context(backward_in_mode(standin))
        compiled_graphs = stack.enter_context(
            compiled.predicting(
                interceptors[F.scaled_dot_product_attention], tracker.sdpa_calls.append
            )
        )
        if default_device is not None:
            # entered after the stand-in, so it runs first and names the device to it
            stack.enter_context(torch.device(default_device))
        workload = build()
        stack.enter_context(fakes_as_real_to_transformers())
        _check_parameters_on_gpu(book, workload, default_device)
        names = {id(module): name for name, module in workload.model.named_modules()}
        _label_model(tracker, workload.model)
        tracker.label_inputs_after_build()
        if transform is not None:
            transform(workload)
        _run_compiled_outside_stand_in(workload, standin, context)
        _prefer_foreach(workload.optimizer)
        try:
            removers.append(install_module_hooks(context, names))
            removers.append(
                install_optimizer_hooks(context, tracker, workload.optimizer, workload.model)
            )
            removers.append(install_gradient_hooks(tracker, workload.model))
            for step in range(num_steps):
                context.start_step(step)
                workload.step()
        finally:
            for remove in removers:
                remove()
        num_parameters = sum(p.numel() for p in workload.model.parameters())
        if compiled_graphs:
            tracker.assumptions.append(compiled.ASSUMPTION)
        trace = tracker.finish(num_steps, num_parameters)
        trace = dataclasses.replace(trace, compiled_graphs=tuple(compiled_graphs))
    if default_device is not None:
        trace = dataclasses.replace(
            trace, assumptions=trace.assumptions + (NO_DEVICE_ASSUMPTION,)
        )
    return trace, workload


NO_DEVICE_ASSUMPTION = (
    "the factory takes no device parameter: it was built and its steps run under "
    "torch.device('cuda'), as `with torch.device('cuda'): factory()` places them on a GPU; "
    "give it a device parameter to control where its tensors go"
)


def _run_compiled_outside_stand_in(
    workload: Workload, standin: StandInMode, context: SiteContext
) -> None:
    """Run each module that the factory or a transform compiled (``Module.compile()``), and the
    loss compile-loss compiled, without the stand-in's function mode, which dynamo would trace
    into; see :mod:`levers.memory.compiled`."""
    for name, module in compiled.compiled_modules(workload.model):
        compiled.run_outside_stand_in(
            module, standin, context.module_stack, name, standin.observer
        )
    loss = compiled.compiled_loss(workload.model)
    if loss is not None:  # compile-loss's: the model reads it through its loss_function
        workload.model._loss_function = compiled.outside_stand_in(
            loss, standin, context.module_stack, "loss_function", standin.observer)


def _check_parameters_on_gpu(
    book: DeviceBook, workload: Workload, default_device: str | None
) -> None:
    """Refuse a prediction that would leave trained parameters out of the GPU's memory."""
    host_bytes = sum(
        p.numel() * p.element_size()
        for p in workload.model.parameters()
        if p.requires_grad and book.device_of(p) == HOST
    )
    if host_bytes == 0:
        return
    how = (
        "the factory takes no device parameter and still put them on the CPU (an explicit "
        "device='cpu'?)"
        if default_device is not None
        else "the factory was given device=cuda but kept them on the CPU"
    )
    raise LeversError(
        f"{host_bytes / 2**20:.1f} MiB of trained parameters stay in host memory in the "
        f"prediction: {how}. levers memory predicts GPU memory only; add a `device` parameter "
        "to the factory and move the model and batch to it (model.to(device)), then run again "
        "(it is called with device='cuda')"
    )


def _label_model(tracker: StorageTracker, model: torch.nn.Module) -> None:
    for name, parameter in model.named_parameters():
        tracker.relabel(parameter, "parameters", name.rpartition(".")[0])
    for name, buffer in model.named_buffers():
        tracker.relabel(buffer, "buffers", name.rpartition(".")[0])


def _prefer_foreach(optimizer: torch.optim.Optimizer | None) -> None:
    if optimizer is None:
        return
    for group in optimizer.param_groups:
        if group.get("foreach", False) is None and not group.get("fused"):
            group["foreach"] = True


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_SDPA_DEFAULTS = {
    "attn_mask": None,
    "dropout_p": 0.0,
    "is_causal": False,
    "scale": None,
    "enable_gqa": False,
}
_NO_AUTOCAST = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def _sdpa_handler(tracker: StorageTracker, target: sdpa.SdpaTarget):
    def handle(func, args: tuple, kwargs: dict) -> Any:
        call = dict(_SDPA_DEFAULTS)
        call.update(zip(_SDPA_ARGS, args))
        call.update(kwargs)
        q, k, v, mask = call["query"], call["key"], call["value"], call["attn_mask"]
        if torch.is_autocast_enabled("cpu"):
            # SDPA is on CUDA's lower-precision list: every floating input is cast first
            dtype = torch.get_autocast_dtype("cpu")
            q, k, v, mask = (_cast(x, dtype) for x in (q, k, v, mask))
        backend, rejected = sdpa.choose_backend(
            q, k, v, mask, call["dropout_p"], call["is_causal"], call["enable_gqa"], target
        )
        described = sdpa.describe(
            backend, q, k, v, mask, call["is_causal"], call["enable_gqa"], rejected
        )
        if compiled.tracing():  # recorded at each run of the compiled graph instead
            compiled.note_traced_attention(described)
        else:
            tracker.sdpa_calls.append(described)
        with torch._C._ExcludeDispatchKeyGuard(_NO_AUTOCAST):
            return sdpa.run_backend(
                backend,
                q,
                k,
                v,
                mask,
                call["dropout_p"],
                call["is_causal"],
                call["scale"],
                call["enable_gqa"],
            )

    return handle


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if (
        isinstance(x, torch.Tensor)
        and x.is_floating_point()
        and x.dtype not in (dtype, torch.float64)
    ):
        return x.to(dtype)
    return x


def _integer_histc(func, args: tuple, kwargs: dict) -> Any:
    """``torch.histc`` of integers: CUDA counts them (a mixture-of-experts router's tokens per
    expert, transformers' ``grouped_mm`` path), the CPU kernel that fake tensors check against
    takes floating point only. Counted on a float copy and returned in the input's dtype, the
    output CUDA gives (``bins`` elements)."""
    values = args[0] if args else kwargs.get("input")
    if not isinstance(values, torch.Tensor) or values.is_floating_point():
        return NotImplemented
    rest = {k: v for k, v in kwargs.items() if k != "input"}
    return func(values.float(), *args[1:], **rest).to(values.dtype)


class _GroupedMm(torch.autograd.Function):
    """A grouped matmul of a ``[tokens, K]`` input by ``[experts, K, N]`` weights as CUDA runs
    it in any dtype: the forward allocates the ``[tokens, N]`` output, the backward the input's
    and the weights' gradients; it saves the two inputs (no new memory)."""

    @staticmethod
    def forward(ctx, a, b, offs):  # type: ignore[override]
        ctx.save_for_backward(a, b)
        return a.new_empty((a.shape[0], b.shape[-1]))

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        a, b = ctx.saved_tensors
        return torch.empty_like(a), torch.empty_like(b), None


def _grouped_mm_any_dtype(func, args: tuple, kwargs: dict) -> Any:
    """``torch._grouped_mm`` (what ``F.grouped_mm`` calls) of float32 or float16 tensors: fake
    tensors check it against the bf16-only fast kernel, while CUDA runs other dtypes through a
    fallback (transformers' mixture of experts casts its input to fp32 master weights under
    autocast). Sizes only: a 2-D input by 3-D weights with ``offs``, the experts' case."""
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    extra = any(value is not None for name, value in kwargs.items() if name != "offs")
    if a.dtype == torch.bfloat16 or a.dim() != 2 or b.dim() != 3 or offs is None or extra:
        return NotImplemented
    return _GroupedMm.apply(a, b, offs)


def _loss_handler(tracker: StorageTracker, shadow: ShadowValues):
    def handle(func, args: tuple, kwargs: dict) -> Any:
        logits = args[0] if args else kwargs.get("input")
        target = args[1] if len(args) > 1 else kwargs.get("target")
        ignore_index = kwargs.get("ignore_index", args[4] if len(args) > 4 else -100)
        if (
            isinstance(logits, torch.Tensor)
            and isinstance(target, torch.Tensor)
            and logits.dim() >= 1
        ):
            num_classes = logits.shape[1] if logits.dim() >= 2 else logits.shape[0]
            num_rows = logits.numel() // max(num_classes, 1)
            valid = None
            if not target.is_floating_point():
                valid = shadow.count_not_equal(target, ignore_index)
            tracker.record_loss(LossCall(num_rows, num_classes, valid))
        return NotImplemented

    return handle
