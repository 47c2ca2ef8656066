"""What the step already does well, with the evidence, so nobody re-fixes it.

Each item is tied to the rule whose pattern it is the good form of (``code``), or to no rule
(allocator settings). An item needs positive evidence in the capture, not just a rule that did
not fire: SDPA calls that run a fused backend, norm calls, checkpoint recomputation, a loss with
no ignored rows, a peak metric with a reset.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from levers.capture.records import Capture
from levers.audit.config import RuleConfig
from levers.audit.rules.loss001_loss_over_ignored_rows import MIN_IGNORED_FRACTION
from levers.audit.rules.mem002_lifetime_peak_metric import PEAK_READS, reset_for
from levers.audit.rules.opt001_unfused_optimizer import optimizer_mode
from levers.audit.rules.sync001_host_device_sync import is_real_sync
from levers.audit.script_step import script_command


@dataclass(frozen=True)
class AlreadyRight:
    code: str | None  # the rule whose pattern this is the fixed form of
    title: str
    detail: str


Check = Callable[[Capture, RuleConfig], AlreadyRight | None]


def _sdpa_backends(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    from levers.audit.rules.attn001_sdpa_math_fallback import backend_choice

    calls = [c for c in capture.calls if c.kind == "sdpa" and c.args.get("query")]
    if not calls:
        return None
    ran = Counter(backend_choice(c, capture, config)[0] for c in calls)
    verb = "run" if config.on_gpu else f"would run on {config.gpu.title}"
    return AlreadyRight(
        "ATTN001",
        "fused attention backend",
        f"{len(calls)} SDPA calls {verb}: "
        + ", ".join(f"{b} x{n}" for b, n in sorted(ran.items())),
    )


def _sdpa_used(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    n = sum(1 for c in capture.calls if c.kind == "sdpa")
    if not n:
        return None
    return AlreadyRight(
        "ATTN002",
        "attention through SDPA",
        f"{n} scaled_dot_product_attention calls; no materialised score matrices",
    )


def _fused_norms(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    names = Counter(c.name for c in capture.calls if c.kind == "norm")
    if not names:
        return None
    return AlreadyRight(
        "NORM001",
        "fused norms",
        ", ".join(f"{n} x{k}" for n, k in sorted(names.items())),
    )


def _checkpointing(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    if not capture.settings.get("activation_checkpointing"):
        return None
    recomputed = sum(1 for op in capture.ops if op.recompute)
    return AlreadyRight(
        "MEM001",
        "activation checkpointing on",
        f"{recomputed} ops recomputed in backward",
    )


def _valid_rows_loss(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    losses = [
        c for c in capture.calls if c.kind == "loss" and "ignored_fraction" in c.args
    ]
    if not losses or any(
        c.args["ignored_fraction"] >= MIN_IGNORED_FRACTION for c in losses
    ):
        return None
    rows = sum(int(c.args.get("num_targets", 0)) for c in losses)
    return AlreadyRight(
        "LOSS001",
        "loss over valid rows only",
        f"{len(losses)} loss calls over {rows} rows, none ignored",
    )


def _no_syncs(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    syncs = [c for c in capture.calls if c.kind == "sync"]
    if any(is_real_sync(c, config.on_gpu) for c in syncs):
        return None
    # one step is what was seen: a loop may sync on some steps only (a log line's loss.item()
    # every N steps), so the claim is about the captured step, never the whole run
    detail = "no call in the captured step waits for the GPU"
    if syncs:
        detail += f" ({len(syncs)} reads of host-side state inside torch skipped)"
    if script_command(capture) is not None:
        detail += (
            "; one step of the script was captured, so a sync its loop makes on other steps "
            "only (a log line's loss.item() every N steps) is not seen here: check the loop"
        )
    return AlreadyRight("SYNC001", "no host-device syncs in the captured step", detail)


def _no_copies(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    scatters = sum(
        1
        for op in capture.ops
        if op.phase == "forward"
        and op.is_inplace
        and op.name.startswith("aten.index_put_")
    )
    detail = (
        "no clone-then-scatter and no user-level copy over 64 MiB in the forward pass"
    )
    if scatters:
        detail += f"; {scatters} in-place scatters write into fresh tensors"
    return AlreadyRight("COPY001", "no needless copies", detail)


def _windowed_peak(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    reads = [
        c for c in capture.calls if c.kind == "memory_metric" and c.name in PEAK_READS
    ]
    if not reads:
        return None
    where = [reset_for(c, capture, config) for c in reads]
    if any(w is None for w in where):
        return None
    return AlreadyRight(
        "MEM002", "windowed peak metric", f"the peak is reset: {where[0]}"
    )


def _fused_optimizer(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    info = capture.settings.get("optimizer") or {}
    if not config.on_gpu or not info or optimizer_mode(capture) != "fused":
        return None
    return AlreadyRight(
        "OPT001", "fused optimizer", f"{info.get('class')} with fused=True"
    )


def _autocast(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    seen = [
        a
        for a in capture.settings.get("autocast", ())
        if a.endswith(("bfloat16", "float16"))
    ]
    if seen:
        return AlreadyRight("DTYPE001", "mixed-precision autocast", ", ".join(seen))
    matmul = [op for op in capture.ops if op.flops and op.inputs]
    low = sum(
        op.flops for op in matmul if op.inputs[0].dtype in ("bfloat16", "float16")
    )
    total = sum(op.flops for op in matmul)
    if not total or low < 0.5 * total:
        return None
    return AlreadyRight(
        "DTYPE001",
        "low-precision matmuls",
        f"{low / total:.0%} of the step's FLOPs run in bf16/fp16",
    )


def _tf32(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    from levers.audit.rules.dtype001_fp32_matmul import tf32_on

    if not config.on_gpu or not tf32_on(capture):
        return None
    return AlreadyRight(
        "DTYPE001",
        "TF32 for fp32 matmuls",
        f"float32_matmul_precision={capture.settings.get('float32_matmul_precision')}",
    )


def _expandable_segments(capture: Capture, config: RuleConfig) -> AlreadyRight | None:
    conf = capture.settings.get("cuda_alloc_conf") or ""
    if "expandable_segments:True" not in conf.replace(" ", ""):
        return None
    return AlreadyRight(
        None, "expandable_segments set", f"PYTORCH_CUDA_ALLOC_CONF={conf}"
    )


CHECKS: dict[str, Check] = {
    "ATTN001": _sdpa_backends,
    "ATTN002": _sdpa_used,
    "NORM001": _fused_norms,
    "MEM001": _checkpointing,
    "LOSS001": _valid_rows_loss,
    "SYNC001": _no_syncs,
    "COPY001": _no_copies,
    "MEM002": _windowed_peak,
    "OPT001": _fused_optimizer,
    "DTYPE001": _autocast,
    "DTYPE001/tf32": _tf32,
    "allocator": _expandable_segments,
}


def already_right(
    capture: Capture, config: RuleConfig, fired: Iterable[str], active: Iterable[str]
) -> list[AlreadyRight]:
    """Good practice seen in the step, for active rules that did not fire (and rule-free items)."""
    fired, active = set(fired), set(active)
    items = []
    for key, check in CHECKS.items():
        code = key.split("/")[0]
        # the rule fired (its pattern is here), or it was not selected
        if code in fired or (code != "allocator" and code not in active):
            continue
        item = check(capture, config)
        if item is not None:
            items.append(item)
    return items
