"""Warm-up and the timed, alternating steps.

The sides alternate step by step (baseline, candidate, baseline, ...) in one process on one
device, so anything that drifts over the run (clocks, temperature, other processes) lands on both.
On CUDA each step is bracketed by a pair of ``torch.cuda.Event``s recorded on the current
stream, and starts on an idle device: a ``synchronize()`` before each step's start event,
outside its timing. Without it a step inherits the other side's backlog: after a step whose host
finishes early (a CUDA graph's replay), the host launches the next side's step while the device
is still busy, and that step's events then time its kernels back to back with none of its own
launch gaps. On an H200 the A/B of a host-bound
eager ViT-B/16 at batch 64 against its CUDA-graph form read a ratio and claim that put the
baseline at about 22 ms, against 27 ms timed alone, and the candidate at its true 18 ms (issue
20): the claim was 57% low. From an idle start the events time what the step costs on its own, launch
gaps included, which is what a training loop that runs one of the two sides pays (less the
overlap of one step's last kernels with the next step's first launches, the same on both sides).
Inside a step nothing waits for the device: losses stay device tensors, memory statistics are
read from the allocator on the host, and one ``synchronize()`` after the loop resolves every
event pair and every loss. On a CPU each step is timed with ``time.perf_counter``.

On CUDA the sides alternate in windows of steps (``AbConfig.window_s``, :data:`WINDOW_S` by
default), not step by step: as many steps a window as the baseline's first window took to pass
half a second, at most a quarter of the timed steps so that each side has four windows or more
(pair ``i`` is still each side's i-th step, a window or so apart). A GPU that runs at its power
cap shares its clock between two sides that alternate step by step: a side that draws less
power (float8 matmuls) lends its headroom to the other, and the two read alike. On an H100 at
its 700 W cap (clocks 1665-1980 MHz, power-cap throttling), float8 on phi's per-block compile
read 1.000x alternating step by step, 1.027x in windows of 0.5 s and of 1 s, and 1.037x with
the sides one at a time; on mistral 1.064x step by step and 1.092x in windows, where the two
built fresh and timed alone differ by 1.080x (bench/results/tune_sweep_h100/s57). Slow drift
still lands on both sides; a training loop runs one side for hours, its own power draw setting
its clock, which the windows approach. On a CPU the sides alternate step by step: its steps are
short, and a window of half a second would be the whole run. Under torchrun with several ranks
too (:func:`window_for`): every rank must switch sides at the same step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from levers.ab.killlines import (
    Kill,
    KillLines,
    KillSignal,
    check_loss,
    check_memory,
    check_time,
)
from levers.ab.memory import close_window, open_window, resident_bytes
from levers.ab.steps import run_step
from levers.workload import Workload

# seconds of steps a window of one side lasts, on CUDA (the module's note on windows)
WINDOW_S = 0.5
# each side has at least this many windows: a window is at most this share of the timed steps
MIN_WINDOWS = 4


@dataclass(frozen=True)
class SideSamples:
    """Every timed step of one side, in order."""

    dur_ms: tuple[float, ...]
    losses: tuple[float | None, ...]
    peak_allocated_bytes: tuple[int, ...] | None  # resident + the step's own rise; None on CPU
    peak_reserved_bytes: tuple[int, ...] | None  # the shared pool's window peak; None on CPU
    resident_bytes_start: int | None
    resident_bytes_end: int | None


@dataclass
class _Collect:
    dur_ms: list[float] = field(default_factory=list)
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)
    losses: list[torch.Tensor | float | None] = field(default_factory=list)
    peak_allocated_bytes: list[int] = field(default_factory=list)
    peak_reserved_bytes: list[int] = field(default_factory=list)


def _first_nonfinite(losses: dict[str, list[float | None]], phase: str) -> Kill | None:
    """The earliest non-finite loss, in the order the steps ran."""
    num_steps = max(len(v) for v in losses.values())
    for i in range(num_steps):
        for side, values in losses.items():
            if i < len(values) and values[i] is not None and not math.isfinite(values[i]):
                try:
                    check_loss(values[i], phase, side, i + 1)
                except KillSignal as signal:
                    return signal.kill
    return None


def _floats(values: Sequence[torch.Tensor | float | None]) -> list[float | None]:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    resolved = (
        iter(torch.stack([t.float() for t in tensors]).cpu().tolist()) if tensors else iter(())
    )
    return [next(resolved) if isinstance(v, torch.Tensor) else v for v in values]


def warm_up(sides: Sequence[tuple[str, Workload]], num_steps: int, lines: KillLines) -> Kill | None:
    """Untimed steps that bring both sides to steady state (caches, autotuning, allocator)."""
    device = torch.device(sides[0][1].device)
    losses: dict[str, list] = {side: [] for side, _ in sides}
    kill = None
    try:
        for step in range(1, num_steps + 1):
            for side, workload in sides:
                check_time(lines, "warmup", side, step)
                loss = run_step(workload, "warmup", side, step, lines)
                losses[side].append(loss)
                if device.type != "cuda":
                    check_loss(None if loss is None else float(loss), "warmup", side, step)
    except KillSignal as signal:
        kill = signal.kill
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: end of warm-up, outside any timed step
    resolved = {side: _floats(values) for side, values in losses.items()}
    return kill or _first_nonfinite(resolved, "warmup")


def _timed_step(
    workload: Workload, side: str, step: int, rec: _Collect, resident: int | None, lines: KillLines
) -> None:
    device = torch.device(workload.device)
    if device.type != "cuda":
        start_s = time.perf_counter()
        loss = run_step(workload, "timed", side, step)
        rec.dur_ms.append((time.perf_counter() - start_s) * 1e3)
        loss_value = None if loss is None else float(loss)
        rec.losses.append(loss_value)
        check_loss(loss_value, "timed", side, step)
        return
    torch.cuda.synchronize(device)  # sync point: an idle device at the start, outside the timing
    start_bytes = open_window(device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    loss = run_step(workload, "timed", side, step)
    end.record()
    peak_bytes, reserved_bytes = close_window(device)
    own_peak_bytes = (resident or 0) + (peak_bytes - start_bytes)
    rec.events.append((start, end))
    rec.losses.append(loss)
    rec.peak_allocated_bytes.append(own_peak_bytes)
    rec.peak_reserved_bytes.append(reserved_bytes)
    check_memory(lines, own_peak_bytes, "timed", side, step)


def _durations(recs: dict[str, _Collect], device: torch.device) -> dict[str, list[float]]:
    """Each side's step times so far (ms). On CUDA this waits for the last step's end event:
    between two steps, where the next step's start waits for an idle device anyway."""
    if device.type != "cuda":
        return {side: list(rec.dur_ms) for side, rec in recs.items()}
    torch.cuda.synchronize(device)  # sync point: between steps, outside any timing
    return {side: [start.elapsed_time(end) for start, end in rec.events]
            for side, rec in recs.items()}


def window_for(device: torch.device | str, window_s: float) -> float:
    """The window run_timed alternates the sides in on ``device``: ``window_s`` on CUDA, none
    (step by step) elsewhere (the module's note on windows) and under torchrun with more than one
    rank: there every rank must switch sides at the same step (each step's collectives meet the
    other ranks' of the same side), and a window timed on each rank's own clock may end at
    different steps."""
    if torch.device(device).type != "cuda":
        return 0.0
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return 0.0
    return window_s


def longest_window(num_steps: int) -> int:
    """The most steps a window of ``num_steps`` timed steps per side may hold: each side then has
    :data:`MIN_WINDOWS` windows or more (one step where there are fewer steps than that)."""
    return max(1, num_steps // MIN_WINDOWS)


def run_timed(
    sides: Sequence[tuple[str, Workload]], num_steps: int, lines: KillLines,
    *, looks: Sequence[int] = (), decided: Callable[[dict[str, list[float]]], bool] | None = None,
    window_s: float = 0.0, clock: Callable[[], float] = time.perf_counter,
) -> tuple[dict[str, SideSamples], Kill | None]:
    """``num_steps`` timed steps per side, alternating; partial samples survive a kill. With
    ``decided``, after each step of ``looks`` (both sides) the step times so far are passed to it
    and the loop stops where it says they decide (:mod:`levers.ab.looks`).

    ``window_s`` > 0: the sides alternate in windows of steps rather than step by step, each
    window as many steps as the first side's first window took to pass ``window_s`` seconds, at
    most :func:`longest_window` (the module's note on windows; ``clock`` reads the host's
    seconds; :func:`window_for` gives CUDA its window and a CPU none); a look falls at the end
    of the window that reaches it."""
    device = torch.device(sides[0][1].device)
    longest = longest_window(num_steps)
    resident = {side: resident_bytes(workload) for side, workload in sides}
    recs = {side: _Collect() for side, _ in sides}
    kill = None
    window = 1 if window_s <= 0 else 0  # 0: set by the first side's first window
    done = 0  # steps each side has timed at the end of the last round of windows
    pending_looks = sorted(looks)
    try:
        while done < num_steps:
            for side, workload in sides:
                started = clock()
                step = done
                while step < num_steps and (window == 0 or step - done < window):
                    step += 1
                    check_time(lines, "timed", side, step)
                    _timed_step(workload, side, step, recs[side], resident[side], lines)
                    if window == 0 and (clock() - started >= window_s or step - done >= longest):
                        window = step - done  # the host's wall over the window's synced steps
                window = window or step - done  # all the steps fit in the first window
            done = step
            reached = [k for k in pending_looks if k <= done]
            pending_looks = [k for k in pending_looks if k > done]
            if decided is not None and reached and decided(_durations(recs, device)):
                break
    except KillSignal as signal:
        kill = signal.kill
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # sync point: resolves every event pair and loss
        for rec in recs.values():
            rec.dur_ms = [start.elapsed_time(end) for start, end in rec.events]
            rec.losses = _floats(rec.losses)
        # the loop never looks at a loss on the device; non-finite ones are found here
        kill = kill or _first_nonfinite({s: r.losses for s, r in recs.items()}, "timed")
    on_cuda = device.type == "cuda"
    samples = {
        side: SideSamples(
            dur_ms=tuple(rec.dur_ms),
            losses=tuple(rec.losses),
            peak_allocated_bytes=tuple(rec.peak_allocated_bytes) if on_cuda else None,
            peak_reserved_bytes=tuple(rec.peak_reserved_bytes) if on_cuda else None,
            resident_bytes_start=resident[side],
            resident_bytes_end=resident_bytes(workload),
        )
        for side, workload in sides
        for rec in (recs[side],)
    }
    return samples, kill
