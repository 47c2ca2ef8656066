"""What the rules reason about besides the capture: the target GPU, the precision assumed, and
the memory model's prediction of the step.

A rule is a pure function of a Capture and this config. On a GPU capture the config's target is
the GPU that ran (when levers knows it); on a CPU capture it is ``--gpu`` and the rules decide
what that GPU, running this torch version, would do with the recorded calls. The memory
prediction (:class:`PredictedMemory`) is made by the caller (``levers audit`` runs
``levers.memory.predict_memory``); rules only read its numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from levers.capture.records import Capture
from levers.hardware import DEFAULT_GPU, GpuSpec, gpu_from_device_name, resolve_gpu

if TYPE_CHECKING:
    from levers.audit.options import AuditOptions

DTYPE_ALIASES = {
    "bf16": "bfloat16",
    "bfloat16": "bfloat16",
    "fp16": "float16",
    "float16": "float16",
    "fp32": "float32",
    "float32": "float32",
}
DEFAULT_TARGET = DEFAULT_GPU  # one default GPU for every verb
DEFAULT_ASSUMED_DTYPE = "bfloat16"


CHECKPOINTING_WHATIF = "activation-checkpointing"
SDPA_WHATIF = "sdpa-attention"
BF16_STATE_WHATIF, INT8_STATE_WHATIF = "bf16-optimizer-states", "8bit-optimizer-states"


@dataclass(frozen=True)
class PredictedMemory:
    """The numbers MEM001 reads from a ``levers.memory`` prediction of the step on a GPU.

    Byte counts are caching-allocator blocks on the predicted GPU (``max_memory_allocated`` and
    ``max_memory_reserved``), over the build and ``num_steps`` steps.

    Attributes:
        gpu: the memory model's GPU name (``h100-80gb``, ``h200``, ``a100-80gb``, ...).
        usable_bytes: what the allocator can reserve on that GPU.
        peak_allocated_bytes / peak_reserved_bytes: the predicted peaks.
        activation_bytes: activations kept for backward, live at the allocated peak.
        checkpointing_applicable: the activation-checkpointing what-if was predicted.
        checkpointing_delta_allocated_bytes / checkpointing_delta_reserved_bytes: its change to
            the peaks (negative: checkpointing lowers them); 0 when not applicable.
        checkpointing_note: why the what-if is not applicable (or how it was predicted).
        sdpa_applicable / sdpa_delta_allocated_bytes / sdpa_delta_reserved_bytes / sdpa_note:
            the same for the eager-attention-to-SDPA what-if (ATTN002's freed memory).
        optimizer_bytes: the optimizer state live at the allocated peak.
        bf16_state_delta_allocated_bytes / int8_state_delta_allocated_bytes: the allocated
            peak's change with Adam's moments in bf16 / 8 bits (the what-ifs
            ``bf16-optimizer-states`` and ``8bit-optimizer-states``); None when not predicted.
        batch_param / batch_now / batch_fit: the workload's batch parameter, its value, and the
            largest value levers memory's fit predicts to fit (None when not searched).
        fit_budget_bytes: the reserved-peak budget of that fit (usable less the margin).
    """

    gpu: str
    usable_bytes: int
    num_steps: int
    peak_allocated_bytes: int
    peak_reserved_bytes: int
    activation_bytes: int
    checkpointing_applicable: bool
    checkpointing_delta_allocated_bytes: int = 0
    checkpointing_delta_reserved_bytes: int = 0
    checkpointing_note: str = ""
    sdpa_applicable: bool = False
    sdpa_delta_allocated_bytes: int = 0
    sdpa_delta_reserved_bytes: int = 0
    sdpa_note: str = "the plan was predicted without what-ifs"
    # the batch parameter of the workload, its value, and the largest value that fits the GPU
    # with the margin (levers memory --fit), when the audit could search it
    batch_param: str | None = None
    batch_now: int | None = None
    batch_fit: int | None = None
    fit_budget_bytes: int = 0
    # the fit stopped at this cap (it fits, so the largest is at least batch_fit); None when the
    # search closed below it
    batch_fit_cap: int | None = None
    # why batch_fit is a lower bound ("the search stops at 16x the batch now"); "" when exact
    batch_fit_note: str = ""
    # the optimizer state at the predicted peak, and the allocated peak's change with the
    # optimizer-state what-ifs (MEM004's freed memory); None when that what-if was not predicted
    optimizer_bytes: int = 0
    bf16_state_delta_allocated_bytes: int | None = None
    int8_state_delta_allocated_bytes: int | None = None


def _whatif_numbers(plan: Any, name: str) -> tuple[bool, int, int, str]:
    """(applicable, delta allocated, delta reserved, note or method) of one what-if."""
    whatif = next((w for w in plan.whatifs if w.name == name), None)
    if whatif is None:
        return False, 0, 0, "the plan was predicted without what-ifs"
    if not whatif.applicable:
        return False, 0, 0, whatif.note
    return True, whatif.delta_allocated_bytes, whatif.delta_reserved_bytes, whatif.method


def predicted_memory_from_plan(plan: Any) -> PredictedMemory:
    """The numbers MEM001 needs from a ``levers.memory.MemoryPlan``.

    Read by attribute so that detectors do not import the memory model (the two are siblings;
    the caller that ran the prediction converts it). A plan predicted without what-ifs reads as
    "checkpointing not predicted".
    """
    categories = {c.category: c.nbytes for c in plan.by_category}
    whatif = next((w for w in plan.whatifs if w.name == CHECKPOINTING_WHATIF), None)
    applicable = whatif is not None and whatif.applicable
    delta_allocated = delta_reserved = 0
    if whatif is None:
        note = "the plan was predicted without what-ifs"
    elif not applicable:
        note = whatif.note
    else:
        note = whatif.method
        delta_allocated = whatif.delta_allocated_bytes
        delta_reserved = whatif.delta_reserved_bytes
    return PredictedMemory(
        gpu=plan.gpu.name,
        usable_bytes=plan.usable_bytes,
        num_steps=plan.num_steps,
        peak_allocated_bytes=plan.peak_allocated_bytes,
        peak_reserved_bytes=plan.peak_reserved_bytes,
        activation_bytes=categories.get("activations", 0),
        checkpointing_applicable=applicable,
        checkpointing_delta_allocated_bytes=delta_allocated,
        checkpointing_delta_reserved_bytes=delta_reserved,
        checkpointing_note=note,
        **dict(zip(_SDPA_FIELDS, _whatif_numbers(plan, SDPA_WHATIF))),
        optimizer_bytes=categories.get("optimizer", 0),
        bf16_state_delta_allocated_bytes=_allocated_delta(plan, BF16_STATE_WHATIF),
        int8_state_delta_allocated_bytes=_allocated_delta(plan, INT8_STATE_WHATIF),
    )


def _allocated_delta(plan: Any, name: str) -> int | None:
    """The allocated peak's change with one what-if; None when it was not predicted."""
    applicable, delta_allocated, _, _ = _whatif_numbers(plan, name)
    return delta_allocated if applicable else None


_SDPA_FIELDS = (
    "sdpa_applicable",
    "sdpa_delta_allocated_bytes",
    "sdpa_delta_reserved_bytes",
    "sdpa_note",
)


@dataclass(frozen=True)
class RuleConfig:
    """The audit's settings that rules and the cost model read.

    Attributes:
        gpu: the GPU costs are for (the one that ran, on a GPU capture; the target otherwise).
        torch_version: (major, minor) of the torch whose SDPA dispatch rules apply.
        on_gpu: the capture ran on a CUDA device (costs can be measured, backends are known).
        assumed_dtype: on a CPU capture that ran in float32 without autocast, the dtype the GPU
            run is assumed to compute in (the built-in workloads use bf16 autocast on a GPU).
            None on a GPU capture, or when the CPU capture already ran in low precision.
        cudnn_version: cuDNN's version number on a GPU capture (e.g. 91002), else None.
        scopes: (file, function) -> the function's globals and closure, for static checks that
            evaluate guards (MEM002); supplied by the caller that still holds the workload.
        memory: the memory model's prediction of the step on the target GPU, for MEM001's
            headroom and ATTN002's freed memory; None when no prediction was made (MEM001 then estimates from the capture).
    """

    gpu: GpuSpec
    torch_version: tuple[int, int]
    on_gpu: bool
    assumed_dtype: str | None = None
    cudnn_version: int | None = None
    scopes: Mapping[tuple[str, str], Mapping[str, Any]] | None = None
    memory: PredictedMemory | None = None

    def compute_dtype(self, recorded: str) -> str:
        """The dtype a recorded float32 tensor would have on the target GPU."""
        if self.assumed_dtype is not None and recorded == "float32":
            return self.assumed_dtype
        return recorded


def parse_torch_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu128"`` -> ``(2, 11)``."""
    parts = text.split("+")[0].split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise ValueError(
            f"torch version {text!r} is not of the form MAJOR.MINOR[.PATCH]; pass e.g. 2.11"
        ) from None


def dtype_of(name: str) -> str:
    """The torch dtype name of ``--assume-dtype``'s value (``bf16`` -> ``bfloat16``).

    Raises:
        ValueError: a name it does not know.
    """
    if name not in DTYPE_ALIASES:
        raise ValueError(f"--assume-dtype {name!r} is not known; use one of: bf16, fp16, fp32")
    return DTYPE_ALIASES[name]


def capture_on_gpu(capture: Capture) -> bool:
    return str(capture.env.get("device", "cpu")).startswith("cuda")


def low_precision_autocasts(
    states: Iterable[str], device_type: str | None = None
) -> list[str]:
    """The bf16/fp16 autocast states of a capture's ``settings["autocast"]`` (``"cuda:bfloat16"``),
    those of ``device_type`` only where one is given."""
    return [
        state for state in states
        if state.endswith(("bfloat16", "float16"))
        and (device_type is None or state.startswith(f"{device_type}:"))
    ]


def ran_in_low_precision(capture: Capture) -> bool:
    """Whether the step computed in bf16/fp16 (autocast seen, or half-precision matmuls)."""
    if low_precision_autocasts(capture.settings.get("autocast", ())):
        return True
    for op in capture.ops:
        if op.flops and op.inputs and op.inputs[0].dtype in ("bfloat16", "float16"):
            return True
    return False


def make_config(
    capture: Capture,
    options: AuditOptions | None = None,
    *,
    cudnn_version: int | None = None,
    scopes: Mapping[tuple[str, str], Mapping[str, Any]] | None = None,
    memory: PredictedMemory | None = None,
) -> RuleConfig:
    """The config for auditing ``capture`` with ``options`` (None: the defaults).

    Raises:
        ValueError: a malformed torch version in the capture.
    """
    named = options.gpu if options is not None else None
    on_gpu = capture_on_gpu(capture)
    gpu = None
    if on_gpu:
        gpu = gpu_from_device_name(str(capture.env.get("device_name", "")))
    if gpu is None:
        gpu = named if named is not None else resolve_gpu(DEFAULT_TARGET)
    torch_version = options.torch_version if options is not None else None
    version = parse_torch_version(torch_version or str(capture.env.get("torch", "2.11")))
    assumed = None
    if not on_gpu and not ran_in_low_precision(capture):
        assume_dtype = options.assume_dtype if options is not None else None
        assumed = dtype_of(assume_dtype or DEFAULT_ASSUMED_DTYPE)
        if assumed == "float32":
            assumed = None  # the GPU run computes in fp32 as the CPU run did
    return RuleConfig(
        gpu=gpu,
        torch_version=version,
        on_gpu=on_gpu,
        assumed_dtype=assumed,
        cudnn_version=cudnn_version,
        scopes=scopes,
        memory=memory,
    )
