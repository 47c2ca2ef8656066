"""The bottleneck of a step: memory- or throughput-bound, and where the step time goes by op class.

    b = step_bottleneck(capture, config)   # config.memory: the memory model's prediction

**Bound.** From the memory model's predicted reserved peak on the GPU that ran (or the target):
"memory-bound" when the step does not fit with the margin, or leaves less than
:data:`MEMORY_BOUND_FREE_SHARE` of the usable memory free; "throughput-bound" otherwise; "unknown"
without a prediction.

**Time by class.** Every op of the capture is assigned to exactly one class of :data:`CLASSES`
(first match wins, in this order):

- ``optimizer``: ops of the optimizer phase;
- ``communication``: collectives (``c10d``/``_c10d_functional`` ops, ``all_reduce``, ...);
- ``attention``: ops inside an SDPA call, SDPA's aten ops, the ops of a hand-written attention
  chain (the eager pattern ATTN002 finds), and the backward ops of all of those;
- ``loss``: ops inside a loss call (cross_entropy, log_softmax, ...) and their backward;
- ``norms``: ops inside an F.layer_norm/F.rms_norm call, fused norm aten ops, the ops of a
  hand-written norm chain (NORM001's pattern), and their backward;
- ``experts``: in a mixture of experts, the ops of the experts module (a module whose class name
  ends in ``Experts``, or a module named ``experts``: their grouped or per-expert matmuls and
  activations), and their backward;
- ``routing``: the other ops of the block that holds the experts (the router's logits, softmax
  and top-k, sorting and scattering the tokens to the experts and back), and their backward;
- ``matmuls``: matmul and convolution aten ops (and any other op that counts FLOPs);
- ``elementwise``: everything else (activations, residual adds, casts, copies, embeddings,
  reductions; views count here and take no time).

A class's time is the device time joined to its ops on a GPU capture, and its roofline time on
the target GPU (:mod:`levers.audit.cost.roofline`, without the per-kernel overhead) on a CPU
capture. ``launch-and-idle`` holds the rest of the step: on a GPU the measured step time minus
all kernel time (launch gaps, host work, syncs); on a CPU the roofline's per-kernel overhead. So
the classes sum to the step (measured, or estimated for the target).

**Against the roofline.** Each class's ceiling is the time its ops would take at 100% of the
GPU's peak: per op, ``max(flops / peak(dtype), bytes / HBM bandwidth)``. FLOP-bound classes
(matmuls, attention) report achieved FLOP/s against the dense peak; the others report achieved
bytes/s against HBM bandwidth. The MFU at the ceiling (every class at its ceiling, no gaps) and
the time each class spends above its ceiling explain the gap between the MFU and the ceiling.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from levers.capture.records import Capture, OpRecord
from levers.audit.config import PredictedMemory, RuleConfig
from levers.audit.cost import roofline
from levers.audit.cost.step import model_flops
from levers.audit.pattern_view import pattern_view
from levers.audit.patterns import base_name, call_op_indices, with_backward
from levers.units import format_bytes, format_ms, format_share
from levers.vocab import ESTIMATED, MEASURED

MATMULS, ATTENTION, NORMS, ELEMENTWISE = "matmuls", "attention", "norms", "elementwise"
LOSS, OPTIMIZER, COMMUNICATION, LAUNCH = "loss", "optimizer", "communication", "launch-and-idle"
EXPERTS, ROUTING = "experts", "routing"
CLASSES = (
    MATMULS, ATTENTION, EXPERTS, ROUTING, NORMS, ELEMENTWISE, LOSS, OPTIMIZER, COMMUNICATION,
    LAUNCH,
)
FLOP_BOUND = (MATMULS, ATTENTION, EXPERTS)

MEMORY_BOUND, THROUGHPUT_BOUND, UNKNOWN = "memory-bound", "throughput-bound", "unknown"
# less free memory than this share of the usable memory: the next batch step does not fit
MEMORY_BOUND_FREE_SHARE = 0.10

_MATMUL_OPS = {
    "mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "dot", "_scaled_mm",
    "convolution", "convolution_backward", "cudnn_convolution", "_convolution",
}
_NORM_OPS = {
    "native_layer_norm", "native_layer_norm_backward", "_fused_rms_norm",
    "_fused_rms_norm_backward", "native_group_norm", "native_group_norm_backward",
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "cudnn_batch_norm", "cudnn_batch_norm_backward",
}
_COLLECTIVES = {
    "all_reduce", "all_reduce_", "all_gather_into_tensor", "reduce_scatter_tensor", "broadcast",
    "broadcast_", "wait_tensor", "allreduce_", "allgather_", "reduce_scatter_", "all_to_all_single",
}


@dataclass(frozen=True)
class ClassTime:
    """One op class of the step against its roofline on the GPU."""

    name: str  # one of CLASSES
    num_ops: int
    time_ms: float  # measured (GPU) or roofline-estimated (CPU) time of its ops
    share: float  # time_ms / the step's time
    flops: int
    bytes: int
    ceiling_ms: float  # at 100% of the GPU's peak FLOP/s or HBM bandwidth
    bound: str  # "FLOP" (against peak FLOP/s), "memory" (against HBM), "" (launch-and-idle)
    achieved: float | None  # FLOP/s or bytes/s achieved; None without time
    peak: float | None  # the ceiling rate it is compared with

    @property
    def efficiency(self) -> float | None:
        """Achieved over the peak rate (0..1); None when not applicable."""
        if self.achieved is None or not self.peak:
            return None
        return self.achieved / self.peak

    @property
    def above_ceiling_ms(self) -> float:
        return max(self.time_ms - self.ceiling_ms, 0.0)


@dataclass(frozen=True)
class Bottleneck:
    bound: str  # MEMORY_BOUND, THROUGHPUT_BOUND or UNKNOWN
    bound_reason: str  # the sentence that states it, with the numbers
    free_bytes: int | None  # usable minus the predicted reserved peak (None: no prediction)
    usable_bytes: int | None
    memory_gpu: str | None
    gpu_title: str  # the GPU the times are for
    provenance: str  # "measured" or "estimated"
    step_ms: float  # the step the classes sum to
    classes: tuple[ClassTime, ...]  # in CLASSES order, every class present
    mfu: float | None
    ceiling_mfu: float | None  # MFU with every class at its ceiling and no gaps

    def of(self, name: str) -> ClassTime:
        return next(c for c in self.classes if c.name == name)

    @property
    def fixed_ms(self) -> float:
        """Time that does not grow with the batch: the optimizer and the launch gaps."""
        return self.of(OPTIMIZER).time_ms + self.of(LAUNCH).time_ms


def classify_ops(capture: Capture) -> tuple[str, ...]:
    """The class of each op of ``capture`` (by index), per the module docstring."""
    view = pattern_view(capture)

    def closure(indices: Iterable[int]) -> set[int]:
        return set(with_backward(indices, view.backward))

    sdpa = closure(call_op_indices(capture, ("sdpa",)))
    sdpa |= closure(i for chain in view.eager_attention for i in chain.ops)
    loss = closure(call_op_indices(capture, ("loss",)))
    norms = closure(call_op_indices(capture, ("norm",)))
    norms |= closure(i for chain in view.unfused_norms for i in chain.ops)
    experts, moe_blocks = moe_modules(capture.modules)
    classes = []
    for op in capture.ops:
        cls = _class_of(op, sdpa, loss, norms)
        if cls in (MATMULS, ELEMENTWISE) and op.module:
            if _within(op.module, experts):
                cls = EXPERTS
            elif _within(op.module, moe_blocks):
                cls = ROUTING
        classes.append(cls)
    return tuple(classes)


def moe_modules(modules: dict[str, str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The experts modules of a mixture of experts (class name ending in ``Experts``, or named
    ``experts``) and the blocks that hold them (their parents: router, experts and the glue)."""
    experts = tuple(
        path for path, cls in modules.items()
        if path and (cls.endswith("Experts") or path.rsplit(".", 1)[-1] == "experts")
    )
    blocks = tuple(path.rpartition(".")[0] for path in experts if "." in path)
    return experts, blocks


def _within(module: str, paths: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in paths)


def _class_of(op: OpRecord, sdpa: set[int], loss: set[int], norms: set[int]) -> str:
    name = base_name(op.name)
    if op.phase == "optimizer":
        return OPTIMIZER
    if "c10d" in op.name or name in _COLLECTIVES:
        return COMMUNICATION
    if op.index in sdpa or "scaled_dot_product" in name or "flash_attention" in name:
        return ATTENTION
    if op.index in loss:
        return LOSS
    if op.index in norms or name in _NORM_OPS:
        return NORMS
    if name in _MATMUL_OPS or op.flops > 0:
        return MATMULS
    return ELEMENTWISE


def _peak_flops(op_dtype: str, config: RuleConfig, tf32: bool) -> float:
    return config.gpu.peak_flops(op_dtype or "bfloat16", tf32=tf32)


def _bound(memory: PredictedMemory | None) -> tuple[str, str, int | None]:
    if memory is None:
        return UNKNOWN, "no memory-model prediction of the step (levers memory did not run)", None
    free = memory.usable_bytes - memory.peak_reserved_bytes
    share = free / memory.usable_bytes if memory.usable_bytes else 0.0
    numbers = (
        f"levers memory predicts a {format_bytes(memory.peak_reserved_bytes)} reserved peak of "
        f"{format_bytes(memory.usable_bytes)} usable on {memory.gpu} "
    )
    if free < 0:
        return MEMORY_BOUND, numbers + f"(over by {format_bytes(-free)}: it does not fit)", free
    if share < MEMORY_BOUND_FREE_SHARE:
        return MEMORY_BOUND, numbers + f"({format_bytes(free)} free, {share:.0%})", free
    return (
        THROUGHPUT_BOUND,
        numbers + f"({format_bytes(free)} free, {share:.0%}): memory does not bind, time does",
        free,
    )


def step_bottleneck(capture: Capture, config: RuleConfig) -> Bottleneck:
    """The bound and the step time by op class; a pure function of the capture and the config."""
    classes = classify_ops(capture)
    tf32 = bool(capture.settings.get("cuda_matmul_allow_tf32"))
    gpu = config.gpu
    bandwidth = gpu.bandwidth_bytes_per_s
    measured = config.on_gpu and any(op.device_us is not None for op in capture.ops)
    time_us = dict.fromkeys(CLASSES, 0.0)
    ceiling_us = dict.fromkeys(CLASSES, 0.0)
    # the time of each class's FLOPs at the peak of each op's own dtype: a class's rate is
    # compared with the peak its ceiling used (fp32 convolutions against fp32's, not bf16's)
    compute_us = dict.fromkeys(CLASSES, 0.0)
    flops = dict.fromkeys(CLASSES, 0)
    nbytes = dict.fromkeys(CLASSES, 0)
    count = dict.fromkeys(CLASSES, 0)
    for op, cls in zip(capture.ops, classes):
        part = roofline.op_part(op, assumed_dtype=config.assumed_dtype, tf32=tf32)
        count[cls] += 1
        flops[cls] += part.flops
        nbytes[cls] += part.bytes
        compute_s = part.flops / _peak_flops(part.dtype, config, tf32) if part.flops else 0.0
        compute_us[cls] += compute_s * 1e6
        ideal_s = max(compute_s, part.bytes / bandwidth)
        ceiling_us[cls] += ideal_s * 1e6
        if measured:
            time_us[cls] += op.device_us or 0.0
        else:
            with_overhead = roofline.part_us(part, gpu)
            overhead = part.num_kernels * roofline.KERNEL_OVERHEAD_US
            time_us[cls] += with_overhead - overhead
            time_us[LAUNCH] += overhead
    if measured:
        step_us = capture.timing.median_s * 1e6
        time_us[LAUNCH] = max(step_us - sum(time_us.values()), 0.0)
        step_us = max(step_us, sum(time_us.values()))
    else:
        step_us = sum(time_us.values())
    peak = gpu.peak_flops("bfloat16")
    rows = []
    for cls in CLASSES:
        t_s = time_us[cls] / 1e6
        bound = "" if cls == LAUNCH else "FLOP" if cls in FLOP_BOUND else "memory"
        if bound == "FLOP":
            # the FLOP-weighted peak of the class's ops' dtypes (bf16's where they are bf16)
            rate = flops[cls] / (compute_us[cls] / 1e6) if compute_us[cls] > 0 else peak
            achieved = flops[cls] / t_s if t_s > 0 else None
        elif bound == "memory":
            achieved, rate = (nbytes[cls] / t_s if t_s > 0 else None), bandwidth
        else:
            achieved, rate = None, None
        rows.append(
            ClassTime(
                name=cls,
                num_ops=count[cls],
                time_ms=time_us[cls] / 1e3,
                share=time_us[cls] / step_us if step_us > 0 else 0.0,
                flops=flops[cls],
                bytes=nbytes[cls],
                ceiling_ms=ceiling_us[cls] / 1e3,
                bound=bound,
                achieved=achieved,
                peak=rate,
            )
        )
    model = model_flops(capture)
    ceiling_total_s = sum(ceiling_us.values()) / 1e6
    bound, reason, free = _bound(config.memory)
    return Bottleneck(
        bound=bound,
        bound_reason=reason,
        free_bytes=free,
        usable_bytes=config.memory.usable_bytes if config.memory else None,
        memory_gpu=config.memory.gpu if config.memory else None,
        gpu_title=gpu.title,
        provenance=MEASURED if measured else ESTIMATED,
        step_ms=step_us / 1e3,
        classes=tuple(rows),
        mfu=model / (step_us / 1e6) / peak if step_us > 0 else None,
        ceiling_mfu=model / ceiling_total_s / peak if ceiling_total_s > 0 else None,
    )


def explain_gap(b: Bottleneck, *, top: int = 3) -> str:
    """One sentence: which classes hold the time between the MFU and the ceiling."""
    if b.mfu is None or b.ceiling_mfu is None:
        return "no model FLOPs counted: MFU does not apply to this step"
    gaps = sorted(
        (c for c in b.classes if c.above_ceiling_ms > 0),
        key=lambda c: -c.above_ceiling_ms,
    )[:top]
    total = sum(c.above_ceiling_ms for c in b.classes)
    parts = ", ".join(
        f"{c.name} {format_ms(c.above_ceiling_ms)} "
        f"({format_share(c.above_ceiling_ms / b.step_ms)} of the step)"
        for c in gaps
    )
    return (
        f"MFU {format_share(b.mfu)} ({b.provenance}); with every class at its roofline ceiling "
        f"and no gaps it would be {format_share(b.ceiling_mfu)}. The {format_ms(total)} above "
        f"the ceilings are mostly: {parts}."
    )


def step_ms_at(b: Bottleneck, batch_now: int, batch: int, *, extra_ms_now: float = 0.0) -> float:
    """The step time at another batch: the fixed time stays, the rest scales with the batch.

    ``extra_ms_now`` is work added per step at ``batch_now`` that scales too (recomputation).
    """
    variable = b.step_ms - b.fixed_ms + extra_ms_now
    return b.fixed_ms + variable * batch / batch_now


def tokens_per_s_ratio(b: Bottleneck, batch_now: int, batch: int, *, extra_ms_now: float = 0.0) -> float:
    """Tokens/s at ``batch`` (with ``extra_ms_now`` of scaling extra work) over tokens/s now."""
    return (batch / step_ms_at(b, batch_now, batch, extra_ms_now=extra_ms_now)) / (
        batch_now / b.step_ms
    )
