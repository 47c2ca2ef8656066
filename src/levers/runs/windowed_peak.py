"""The windowed peak: device memory per window of steps, and the lifetime peak beside it.

``torch.cuda.max_memory_allocated()`` is the highest allocation since the process started (or
since the last ``reset_peak_memory_stats()``). Logged unreset, it can only rise: a one-off
transient (a checkpoint load, one long batch) reads as a permanent "creep" for the rest of the
run. The windowed peak resets the allocator's peak once per window of steps and reads it at the
window's end, so each window shows its own peak; the lifetime maximum is kept on the host as the
maximum of the window peaks. Both are logged.

What ran before the first guarded step (building the model, loading a checkpoint) is logged as
the startup window: its peak is read, and the first reset happens, at the first step.

A reader is anything with ``peak_bytes()`` (the peak since the last reset) and ``reset()``; on
CUDA it is :class:`CudaPeakReader`, and tests inject their own to plant a memory ramp on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


class PeakReader(Protocol):
    def peak_bytes(self) -> int:
        """The highest allocated bytes since the last reset."""

    def reset(self) -> None:
        """Start a new window: the peak becomes what is allocated now."""


@dataclass(frozen=True)
class CudaPeakReader:
    """The CUDA caching allocator's peak of one device (host-side reads, no device sync)."""

    device: torch.device

    def peak_bytes(self) -> int:
        return torch.cuda.max_memory_allocated(self.device)

    def reset(self) -> None:
        torch.cuda.reset_peak_memory_stats(self.device)


@dataclass(frozen=True)
class MemoryWindow:
    """One window's peak and the lifetime peak at its end."""

    index: int  # 0 is the startup window (before the first guarded step)
    first_step: int | None  # None for the startup window
    last_step: int | None
    window_peak_bytes: int
    lifetime_peak_bytes: int


class WindowedPeak:
    """Counts steps, closes a window every ``window_steps`` steps and reads its peak."""

    def __init__(self, reader: PeakReader, window_steps: int) -> None:
        if not isinstance(window_steps, int) or window_steps < 1:
            raise ValueError(f"window_steps must be a positive integer, got {window_steps!r}")
        self.reader = reader
        self.window_steps = window_steps
        self.lifetime_peak_bytes = 0
        self._index = 0
        self._first_step: int | None = None
        self._num_steps = 0

    def _close(self, first_step: int | None, last_step: int | None) -> MemoryWindow:
        peak = int(self.reader.peak_bytes())
        self.reader.reset()
        self.lifetime_peak_bytes = max(self.lifetime_peak_bytes, peak)
        window = MemoryWindow(self._index, first_step, last_step, peak, self.lifetime_peak_bytes)
        self._index += 1
        return window

    def start(self) -> MemoryWindow:
        """The startup window; call once, right before the first guarded step runs."""
        return self._close(None, None)

    def observe(self, step: int) -> MemoryWindow | None:
        """Count a finished step; the window it closes, if it closes one."""
        if self._first_step is None:
            self._first_step = step
        self._num_steps += 1
        if self._num_steps < self.window_steps:
            return None
        window = self._close(self._first_step, step)
        self._first_step, self._num_steps = None, 0
        return window

    def flush(self, last_step: int | None) -> MemoryWindow | None:
        """Close a partly filled window (at the end of a run)."""
        if self._num_steps == 0:
            return None
        window = self._close(self._first_step, last_step)
        self._first_step, self._num_steps = None, 0
        return window
