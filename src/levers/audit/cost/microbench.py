"""GPU microbenchmarks of a fix at the exact shapes a finding saw.

Each benchmark builds random inputs of the recorded shapes and dtypes on the current CUDA device
and times the fixed computation, forward and backward: ``warmup`` untimed runs, then ``samples``
profiled samples of ``iters`` runs each; a sample is the summed duration of the kernels the runs
launched (the profiler's device timeline), per run; the result is the median and the spread.
Kernel time is what a capture measures for the "now" side of a finding, so "now" and "fixed" are
the same quantity; a CUDA-event loop would also count the launch gaps between small kernels,
which inside a training step overlap with other work. Anything that cannot run here (a backend this
build or GPU lacks, an out-of-memory) returns an "unavailable" result with the reason instead of
raising.

Used by :mod:`levers.audit.cost.price` on GPU captures and by ``bench/audit_microbench.py``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

from levers.capture.gpu import summed_kernel_us

_DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
# where benchmarks run; tests on a CPU switch it to "cpu" to exercise everything but the timing
DEVICE = "cuda"


@dataclass(frozen=True)
class Timing:
    median_us: float | None
    min_us: float | None = None
    max_us: float | None = None
    samples: int = 0
    unavailable: str | None = None  # why it could not run

    @property
    def ok(self) -> bool:
        return self.median_us is not None


def unavailable(reason: str) -> Timing:
    return Timing(median_us=None, unavailable=reason)


def time_cuda(
    fn: Callable[[], Any], *, warmup: int = 3, samples: int = 7, iters: int = 5
) -> Timing:
    """Median and spread of one run of ``fn`` on the current CUDA stream, in microseconds."""
    if DEVICE != "cuda":
        return _time_host(fn, warmup=warmup, samples=samples, iters=iters)
    if not torch.cuda.is_available():
        return unavailable("no CUDA device")

    try:
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()  # sync point: benchmark boundary
        per_run = []
        for _ in range(samples):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(iters):
                    fn()
                torch.cuda.synchronize()  # sync point: end of the profiled sample
            per_run.append(summed_kernel_us(prof) / iters)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return unavailable("out of memory at these shapes")
    except RuntimeError as exc:
        return unavailable(_short(exc))
    return Timing(statistics.median(per_run), min(per_run), max(per_run), samples)


def _time_host(
    fn: Callable[[], Any], *, warmup: int, samples: int, iters: int
) -> Timing:
    try:
        for _ in range(warmup):
            fn()
        per_run = []
        for _ in range(samples):
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            per_run.append((time.perf_counter() - t0) * 1e6 / iters)
    except RuntimeError as exc:
        return unavailable(_short(exc))
    return Timing(statistics.median(per_run), min(per_run), max(per_run), samples)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:200]


def _tensor(shape, dtype: str, *, grad: bool) -> torch.Tensor:
    t = torch.randn(*shape, device=DEVICE, dtype=_DTYPES.get(dtype, torch.float32))
    return t.requires_grad_(grad)


def _backend(name: str | None):
    if name is None:
        return None
    backend = getattr(SDPBackend, name, None)
    if backend is None:
        raise LookupError(
            f"SDPBackend.{name} does not exist in torch {torch.__version__}"
        )
    return backend


def forward_backward(
    fn: Callable[[], torch.Tensor], grad_out: bool
) -> Callable[[], None]:
    """``fn`` then, when training, the gradients of its inputs for a ones gradient.

    The gradients are returned, not accumulated into ``.grad``: inside a step they flow on to
    earlier ops, and an accumulation would add kernels the step does not run.
    """
    grads: dict[tuple, torch.Tensor] = {}

    def run() -> None:
        out = fn()
        leaves = input_leaves(out) if grad_out else []
        if leaves:
            key = (tuple(out.shape), out.dtype)
            if key not in grads:
                grads[key] = torch.ones_like(out)
            torch.autograd.grad(out, leaves, grads[key])

    return run


def input_leaves(out: torch.Tensor) -> list[torch.Tensor]:
    """The leaf tensors ``out`` depends on, from the AccumulateGrad nodes of its graph."""
    leaves, seen, stack = [], set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):
            leaves.append(node.variable)
        stack.extend(child for child, _ in node.next_functions)
    return leaves


def bench_sdpa(spec: dict[str, Any], backend: str | None, **timing: int) -> Timing:
    """F.scaled_dot_product_attention at the recorded shapes, restricted to ``backend``."""
    try:
        grad = bool(spec.get("requires_grad", True))
        q = _tensor(spec["query"]["shape"], spec["query"]["dtype"], grad=grad)
        k = _tensor(spec["key"]["shape"], spec["key"]["dtype"], grad=grad)
        v = _tensor(spec["value"]["shape"], spec["value"]["dtype"], grad=grad)
        mask = None
        if spec.get("attn_mask") is not None:
            m = spec["attn_mask"]
            if m["dtype"] == "bool":
                mask = torch.ones(*m["shape"], device=DEVICE, dtype=torch.bool)
            else:
                mask = torch.zeros(
                    *m["shape"], device=DEVICE, dtype=_DTYPES.get(m["dtype"], q.dtype)
                )
        kwargs: dict[str, Any] = {
            "attn_mask": mask,
            "dropout_p": spec.get("dropout_p", 0.0),
            "is_causal": spec.get("is_causal", False),
        }
        if spec.get("scale") is not None:
            kwargs["scale"] = spec["scale"]
        if spec.get("enable_gqa"):
            kwargs["enable_gqa"] = True
        chosen = _backend(backend)

        def call() -> torch.Tensor:
            if chosen is None:
                return F.scaled_dot_product_attention(q, k, v, **kwargs)
            with sdpa_kernel([chosen]):
                return F.scaled_dot_product_attention(q, k, v, **kwargs)

        run = forward_backward(call, grad)
        run()  # fails here, not in the timing loop, when the backend cannot take the call
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return unavailable("out of memory at these shapes")
    except (RuntimeError, LookupError, ImportError, TypeError) as exc:
        return unavailable(f"{backend or 'SDPA'}: {_short(exc)}")
    t = time_cuda(run, **timing)
    return t if t.ok else unavailable(f"{backend or 'SDPA'}: {t.unavailable}")


def bench_rms_norm(shape, dtype: str, *, grad: bool = True, **timing: int) -> Timing:
    """F.rms_norm over the last dimension of a tensor of ``shape``."""
    if not hasattr(F, "rms_norm"):
        return unavailable(f"F.rms_norm does not exist in torch {torch.__version__}")
    try:
        x = _tensor(shape, dtype, grad=grad)
        w = torch.ones(shape[-1], device=DEVICE, dtype=x.dtype, requires_grad=grad)
        run = forward_backward(lambda: F.rms_norm(x, (shape[-1],), w, 1e-6), grad)
        run()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return unavailable("out of memory at these shapes")
    except RuntimeError as exc:
        return unavailable(_short(exc))
    return time_cuda(run, **timing)


def bench_layer_norm(shape, dtype: str, *, grad: bool = True, **timing: int) -> Timing:
    try:
        x = _tensor(shape, dtype, grad=grad)
        w = torch.ones(shape[-1], device=DEVICE, dtype=x.dtype, requires_grad=grad)
        b = torch.zeros(shape[-1], device=DEVICE, dtype=x.dtype, requires_grad=grad)
        run = forward_backward(lambda: F.layer_norm(x, (shape[-1],), w, b, 1e-6), grad)
        run()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return unavailable("out of memory at these shapes")
    except RuntimeError as exc:
        return unavailable(_short(exc))
    return time_cuda(run, **timing)


def bench_loss_rows(spec: dict[str, Any], **timing: int) -> Timing:
    """The loss over ``spec["rows"]`` rows only: the head matmul (when the loss input came from
    one), the cast to the loss's dtype, and cross-entropy, forward and backward."""
    try:
        rows, vocab = int(spec["rows"]), int(spec["vocab"])
        head = spec.get("head")
        target = torch.randint(0, vocab, (rows,), device=DEVICE)
        loss_dtype = _DTYPES.get(spec["loss_dtype"], torch.float32)
        if head is not None:
            h = _tensor([rows, head["hidden"]], head["dtype"], grad=True)
            w = _tensor([vocab, head["hidden"]], head["dtype"], grad=True)

            def logits() -> torch.Tensor:
                return h @ w.t()
        else:
            x = _tensor([rows, vocab], spec["input_dtype"], grad=True)

            def logits() -> torch.Tensor:
                return x

        run = forward_backward(lambda: F.cross_entropy(logits().to(loss_dtype), target), True)
        run()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return unavailable("out of memory at these shapes")
    except (RuntimeError, KeyError) as exc:
        return unavailable(_short(exc))
    return time_cuda(run, **timing)
