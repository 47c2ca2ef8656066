"""``levers audit --trace FILE``: the captured step as a Chrome / Perfetto trace.

The file is the Trace Event Format's JSON object form (``{"traceEvents": [...]}``), which
chrome://tracing, https://ui.perfetto.dev and most profilers' viewers open. Tracks:

- process "host" (pid 1): thread "phases" (one span per contiguous run of forward, backward,
  optimizer), thread "modules" (one span per contiguous run of ops in one innermost module) and
  thread "aten ops" (every op as a complete event with its module, phase, source line, code,
  shapes, FLOPs and bytes in ``args``);
- process "device" (pid 2), on a GPU capture: thread "kernels", each kernel with the op that
  launched it. Host and device clocks are not the same clock: the kernel track is placed so that
  its first joined kernel starts where the op that launched it starts.

Times are host microseconds from the capture's start (``OpRecord.start_us``); a capture written
before ops carried a start lays them end to end by their wall time.
"""

from __future__ import annotations

import json
import os
from typing import Any

from levers.capture.records import Capture, OpRecord, TensorMeta
from levers.output.atomic import atomic_open

HOST_PID, DEVICE_PID = 1, 2
PHASE_TID, MODULE_TID, OP_TID, KERNEL_TID = 1, 2, 3, 1
_MIN_DUR_US = 0.001  # a zero-length complete event is hidden by some viewers


def _meta(t: TensorMeta) -> str:
    return f"[{', '.join(str(d) for d in t.shape)}] {t.dtype}"


def _short_name(op: OpRecord) -> str:
    name = op.name.removeprefix("aten.")
    return name.removesuffix(".default")


def _starts_us(ops: tuple[OpRecord, ...]) -> list[float]:
    if all(op.start_us is not None for op in ops):
        return [float(op.start_us) for op in ops]  # type: ignore[arg-type]
    starts, t = [], 0.0
    for op in ops:
        starts.append(t)
        t += op.wall_us
    return starts


def _spans(ops, starts, key) -> list[tuple[Any, float, float]]:
    """(value, start, end) for each contiguous run of ops with the same ``key(op)``."""
    spans: list[tuple[Any, float, float]] = []
    for op, start in zip(ops, starts):
        end = start + max(op.wall_us, _MIN_DUR_US)
        value = key(op)
        if spans and spans[-1][0] == value:
            spans[-1] = (value, spans[-1][1], end)
        else:
            spans.append((value, start, end))
    return spans


def _thread_name(pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}}


def trace_events(capture: Capture) -> dict[str, Any]:
    """The trace of ``capture`` as a JSON-ready dict."""
    ops = capture.ops
    starts = _starts_us(ops)
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": HOST_PID, "args": {"name": "host"}},
        _thread_name(HOST_PID, PHASE_TID, "phases"),
        _thread_name(HOST_PID, MODULE_TID, "modules"),
        _thread_name(HOST_PID, OP_TID, "aten ops"),
    ]
    for phase, start, end in _spans(ops, starts, lambda op: op.phase):
        events.append({"name": phase, "cat": "phase", "ph": "X", "ts": start,
                       "dur": end - start, "pid": HOST_PID, "tid": PHASE_TID})
    for module, start, end in _spans(ops, starts, lambda op: op.module):
        if module is None:
            continue
        events.append({"name": module or "<model>", "cat": "module", "ph": "X", "ts": start,
                       "dur": end - start, "pid": HOST_PID, "tid": MODULE_TID,
                       "args": {"class": capture.modules.get(module)}})
    for op, start in zip(ops, starts):
        args: dict[str, Any] = {
            "index": op.index,
            "op": op.name,
            "phase": op.phase,
            "module": op.module,
            "source": str(op.source) if op.source is not None else None,
            "code": op.source.code if op.source is not None else None,
            "inputs": [_meta(t) for t in op.inputs],
            "outputs": [_meta(t) for t in op.outputs],
            "flops": op.flops,
            "read_bytes": op.read_bytes,
            "write_bytes": op.write_bytes,
        }
        if op.device_us is not None:
            args["device_us"] = op.device_us
        if op.live_bytes is not None:
            args["live_bytes"] = op.live_bytes
        if op.recompute:
            args["recompute"] = True
        events.append({"name": _short_name(op), "cat": op.phase, "ph": "X", "ts": start,
                       "dur": max(op.wall_us, _MIN_DUR_US), "pid": HOST_PID, "tid": OP_TID,
                       "args": args})
    if capture.kernels:
        events += _kernel_events(capture, starts)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "producer": "levers audit --trace",
            "workload": capture.workload,
            "device": capture.env.get("device_name"),
            "torch": capture.env.get("torch"),
            "levers": capture.env.get("levers"),
        },
    }


def _kernel_events(capture: Capture, starts: list[float]) -> list[dict[str, Any]]:
    kernels = capture.kernels
    anchor = 0.0
    for k in kernels:
        if k.op_index is not None and k.start_us is not None and k.op_index < len(starts):
            anchor = starts[k.op_index] - k.start_us
            break
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": DEVICE_PID,
         "args": {"name": f"device {capture.env.get('device_name', '')}".strip()}},
        _thread_name(DEVICE_PID, KERNEL_TID, "kernels"),
    ]
    t = 0.0
    for k in kernels:
        offset = k.start_us if k.start_us is not None else t
        t = offset + k.device_us
        op = capture.ops[k.op_index] if k.op_index is not None and k.op_index < len(capture.ops) else None
        events.append({
            "name": k.name, "cat": "kernel", "ph": "X", "ts": anchor + offset,
            "dur": max(k.device_us, _MIN_DUR_US), "pid": DEVICE_PID, "tid": KERNEL_TID,
            "args": {
                "op_index": k.op_index,
                "op": op.name if op is not None else None,
                "module": op.module if op is not None else None,
                "phase": op.phase if op is not None else None,
            },
        })
    return events


def write_trace(capture: Capture, path: str | os.PathLike[str]) -> None:
    """Write the trace of ``capture`` to ``path`` atomically."""
    with atomic_open(path) as f:
        json.dump(trace_events(capture), f, separators=(",", ":"), allow_nan=False)
        f.write("\n")
