"""Run guards: kill lines, the windowed memory peak and resume checks for a training loop.

    guard = levers.RunGuard(
        metric_bars=[levers.MetricBar("eval_loss", bar=4.0, num_evals=3, after_step=1000)],
        mem_gate_gib=70, step_time_max_ratio=1.5, record="run.record.jsonl",
        checkpoint=lambda step, kill: save(step),
    )
    with guard:                                    # a kill ends the block cleanly
        for step in range(start, num_steps):
            loss = train_step()
            guard.step(step, loss=loss)            # may raise RunKilled
            if step % eval_every == 0:
                guard.eval(step, metrics={"eval_loss": evaluate()})
    if guard.killed: ...

**How a kill stops the run.** A kill line that fires raises :class:`RunKilled` from ``step``,
``eval`` or ``check_banner``. An exception was chosen over a returned flag because a flag that
the loop forgets to read keeps training on NaNs. Before raising, the guard appends the ``kill``
event (which line, at which step, the values) to the record, then calls the user's
``checkpoint(step, kill)`` hook (its outcome is recorded too; the hook sees the kill and may
decide not to save NaN weights). Used as a context manager, the guard catches its own
``RunKilled`` at the end of the ``with`` block, so code after the block runs and reads
``guard.killed``; without one, catch ``RunKilled`` yourself.

**Kill lines.**

- non-finite loss: always on. A float loss is checked at once; a tensor loss is read every
  ``nonfinite_check_every`` steps (default 1: a host sync per step, which most loops already pay
  to log the loss; with N > 1 the first bad step is kept on the device and the kill still names
  it exactly, at most N - 1 steps late).
- a metric worse than its bar for ``num_evals`` evals in a row, counting only evals at steps
  after ``after_step`` (:class:`MetricBar`).
- a memory gate on the windowed peak (see ``windowed_peak.py``), judged when a window closes.
- a step-time regression: the median step time of a window against the median of the first
  full window after ``step_time_warmup_steps``. A step time is the host time between two
  ``step()`` calls; an interval that holds an ``eval()`` is left out.

Every window's peak, lifetime peak and step-time median is logged (to ``log`` if given, to the
record, and to ``guard.windows``).
"""

from __future__ import annotations

import math
import time
import warnings
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch

from levers.runs import resume
from levers.ab.killlines import GIB
from levers.ab.record import append_event
from levers.ab.stats import quantile
from levers.runs.metric_bar import MetricBar
from levers.runs.prereg import guard_settings, load_frozen_run_prereg
from levers.runs.windowed_peak import CudaPeakReader, MemoryWindow, PeakReader, WindowedPeak
from levers.errors import LeversError

LINES = ("nonfinite_loss", "metric_bar", "memory_gate", "step_time_regression", "banner_gate")


@dataclass(frozen=True)
class GuardKill:
    """Which kill line fired, at which step, with the values that fired it."""

    line: str  # one of LINES
    step: int | None  # None: before the first step (the banner gate)
    reason: str
    values: dict[str, Any]


class RunKilled(Exception):
    """A kill line fired; the run should stop. ``kill`` says which and why."""

    def __init__(self, kill: GuardKill) -> None:
        super().__init__(f"{kill.line} at step {kill.step}: {kill.reason}")
        self.kill = kill


@dataclass(frozen=True)
class GuardWindow:
    """One window of steps: its memory peak (when measured) and its step-time median."""

    first_step: int
    last_step: int
    memory: MemoryWindow | None
    median_step_s: float | None
    num_timed_steps: int


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _default_reader(device: torch.device | None) -> PeakReader | None:
    if device is not None and torch.device(device).type == "cuda":
        return CudaPeakReader(torch.device(device))
    if device is None and torch.cuda.is_available():
        return CudaPeakReader(torch.device("cuda", torch.cuda.current_device()))
    return None


class RunGuard:
    """Kill lines, windowed memory peaks and resume checks for one training run."""

    def __init__(
        self,
        *,
        metric_bars: Sequence[MetricBar] = (),
        mem_gate_gib: float | None = None,
        step_time_max_ratio: float | None = None,
        step_time_warmup_steps: int = 0,
        window_steps: int = 100,
        banner: Mapping[str, int] | None = None,
        record: str | Path | None = None,
        checkpoint: Callable[[int | None, GuardKill], Any] | None = None,
        log: Callable[[dict[str, Any]], Any] | None = None,
        memory_reader: PeakReader | None = None,
        device: torch.device | str | None = None,
        clock: Callable[[], float] = time.perf_counter,
        nonfinite_check_every: int = 1,
        prereg: dict[str, Any] | None = None,
    ) -> None:
        if mem_gate_gib is not None and not mem_gate_gib > 0:
            raise ValueError(f"mem_gate_gib must be positive, got {mem_gate_gib!r}")
        if step_time_max_ratio is not None and not step_time_max_ratio > 1:
            raise ValueError(
                "step_time_max_ratio must be above 1 (1.5: 50% slower), got "
                f"{step_time_max_ratio!r}"
            )
        if not isinstance(window_steps, int) or window_steps < 2:
            raise ValueError(f"window_steps must be an integer >= 2, got {window_steps!r}")
        if not isinstance(nonfinite_check_every, int) or nonfinite_check_every < 1:
            raise ValueError(f"nonfinite_check_every must be >= 1, got {nonfinite_check_every!r}")
        names = [b.name for b in metric_bars]
        if len(set(names)) != len(names):
            raise ValueError(f"one MetricBar per metric, got {names}")
        self.metric_bars = tuple(metric_bars)
        self.mem_gate_bytes = None if mem_gate_gib is None else int(mem_gate_gib * GIB)
        self.step_time_max_ratio = step_time_max_ratio
        self.step_time_warmup_steps = step_time_warmup_steps
        self.window_steps = window_steps
        self.banner = None if banner is None else dict(banner)
        self.record = None if record is None else Path(record)
        if self.record is not None and not self.record.parent.is_dir():
            raise LeversError(
                f"the folder of the run record {self.record} does not exist; create it or pass "
                "another record path"
            )
        self.checkpoint = checkpoint
        self.log = log
        self.clock = clock
        self.nonfinite_check_every = nonfinite_check_every
        self.prereg = prereg
        reader = memory_reader if memory_reader is not None else _default_reader(device)
        self.memory = None if reader is None else WindowedPeak(reader, window_steps)
        if self.mem_gate_bytes is not None and self.memory is None:
            warnings.warn(
                "the memory gate is not enforced: no CUDA device and no memory_reader",
                stacklevel=2,
            )
        self.killed: GuardKill | None = None
        self.windows: list[GuardWindow] = []
        self.startup_memory: MemoryWindow | None = None
        self.events: list[dict[str, Any]] = []
        self.banner_checked = self.banner is None
        self._started = False
        self._closed = False
        self._last_step: int | None = None
        self._last_time: float | None = None
        self._skip_interval = False
        self._window_first: int | None = None
        self._window_durations: list[float] = []
        self._window_num_steps = 0
        self._reference_step_s: float | None = None
        self._streaks = {b.name: [] for b in self.metric_bars}
        self._pending_bad: tuple[torch.Tensor, torch.Tensor] | None = None
        self._num_since_check = 0

    # ---- construction from a pre-registration ---------------------------------------------

    @classmethod
    def from_prereg(cls, path: str | Path, **kwargs: Any) -> RunGuard:
        """A guard with the kill lines and gates of a frozen run pre-registration.

        The file must be frozen (``levers prereg freeze FILE``) and unchanged since; the guard
        writes to the pre-registration's record. ``kwargs`` are the hooks and readers
        (``checkpoint``, ``log``, ``memory_reader``, ``device``, ``clock``,
        ``nonfinite_check_every``); kill lines and gates come from the file alone.
        """
        prereg, state = load_frozen_run_prereg(path)
        settings = guard_settings(prereg)
        clash = sorted(set(kwargs) & set(settings))
        if clash:
            raise LeversError(
                f"{', '.join(clash)} come(s) from the frozen pre-registration {path}; amend the "
                "file instead of passing them"
            )
        return cls(
            **settings,
            record=state.record_path,
            prereg={"path": str(path), "sha256": state.sha256},
            **kwargs,
        )

    # ---- events -----------------------------------------------------------------------------

    def _emit(self, event: dict[str, Any]) -> None:
        event = {"event": event.pop("event"), "at": _now(), **event}
        self.events.append(event)
        if self.record is not None:
            append_event(self.record, event)
        if self.log is not None:
            self.log(event)

    def _start(self) -> None:
        self._started = True
        if self.memory is not None:
            self.startup_memory = self.memory.start()
        self._emit(
            {
                "event": "guard_start",
                "prereg": self.prereg,
                "kill_lines": {
                    "nonfinite_loss": True,
                    "metric_bars": [asdict(b) for b in self.metric_bars],
                    "mem_gate_bytes": self.mem_gate_bytes,
                    "step_time_max_ratio": self.step_time_max_ratio,
                    "step_time_warmup_steps": self.step_time_warmup_steps,
                },
                "window_steps": self.window_steps,
                "banner": self.banner,
                "memory_measured": self.memory is not None,
                "startup_peak_bytes": None
                if self.startup_memory is None
                else self.startup_memory.window_peak_bytes,
            }
        )

    def _kill(self, line: str, step: int | None, reason: str, values: dict[str, Any]) -> None:
        kill = GuardKill(line, step, reason, values)
        self.killed = kill
        self._emit({"event": "kill", **asdict(kill)})
        # the model is at the last guarded step (a deferred NaN check names an earlier one)
        at = self._last_step
        if self.checkpoint is not None and at is not None:
            try:
                self.checkpoint(at, kill)
            except Exception as exc:  # the kill stands; the failed save is recorded with it
                self._emit({"event": "checkpoint", "step": at, "ok": False, "error": repr(exc)})
                warnings.warn(
                    f"the checkpoint hook raised {type(exc).__name__}: {exc}; the run is killed "
                    "without that checkpoint",
                    stacklevel=3,
                )
                raise RunKilled(kill) from exc
            self._emit({"event": "checkpoint", "step": at, "ok": True})
        raise RunKilled(kill)

    def _refuse_after_kill(self) -> None:
        if self.killed is not None:
            raise RunKilled(self.killed)

    # ---- gates before step 1 ----------------------------------------------------------------

    def check_banner(self, observed: Mapping[str, int]) -> resume.CheckResult:
        """The dataset banner against the declared counts; a mismatch kills before step 1."""
        if self.banner is None:
            raise LeversError(
                "no banner was declared: pass RunGuard(banner={...}) or declare [gates] banner "
                "in the pre-registration"
            )
        result = resume.check_banner(self.banner, observed)
        self._emit({"event": "banner", **asdict(result)})
        if not result.passed:
            self._kill("banner_gate", None, result.message, result.values)
        self.banner_checked = True
        return result

    def check_resume(
        self,
        *,
        seed: int | None = None,
        checkpoint_seed: int | None = None,
        seed_reuse_reason: str | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        fix_step_tensors: bool = False,
        step: int | None = None,
        checkpoint_step: int | None = None,
        checkpoint_optimizer_state: Mapping[str, Any] | None = None,
        scheduler: Any = None,
        checkpoint_scheduler_state: Mapping[str, Any] | None = None,
    ) -> list[resume.CheckResult]:
        """Run the resume checks whose inputs are given; raise ResumeError if any fails.

        Call it after loading the checkpoint and before the first step. With
        ``fix_step_tensors`` misplaced fused/capturable step tensors are moved (and the move is
        recorded) instead of failing the check.
        """
        results = []
        if seed is not None or checkpoint_seed is not None:
            if seed is None or checkpoint_seed is None:
                raise ValueError("the seed check needs both seed and checkpoint_seed")
            results.append(resume.check_seed(seed, checkpoint_seed, reason=seed_reuse_reason))
        if optimizer is not None:
            if fix_step_tensors:
                moved = resume.rehome_step_tensors(optimizer)
                if moved:
                    self._emit({"event": "rehome_step_tensors", "num_moved": moved})
            results.append(resume.check_optimizer_step_devices(optimizer))
            if checkpoint_optimizer_state is not None:
                results.append(resume.check_learning_rates(optimizer, checkpoint_optimizer_state))
        if step is not None or checkpoint_step is not None:
            if step is None or checkpoint_step is None:
                raise ValueError("the step check needs both step and checkpoint_step")
            results.append(resume.check_step(step, checkpoint_step))
        if scheduler is not None or checkpoint_scheduler_state is not None:
            if scheduler is None or checkpoint_scheduler_state is None:
                raise ValueError(
                    "the scheduler check needs scheduler and checkpoint_scheduler_state",
                )
            results.append(resume.check_scheduler(scheduler, checkpoint_scheduler_state))
        if not results:
            raise ValueError("check_resume was given nothing to check")
        self._emit({"event": "resume_check", "checks": [asdict(r) for r in results]})
        failed = [r for r in results if not r.passed]
        if failed:
            raise resume.ResumeError(
                "resume check failed: " + "; ".join(f"[{r.check}] {r.message}" for r in failed)
            )
        return results

    # ---- per step ----------------------------------------------------------------------------

    def _check_loss(self, step: int, loss: Any) -> None:
        if loss is None:
            return
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ValueError(
                    f"loss must be a scalar, got a tensor of shape {tuple(loss.shape)}",
                )
            loss = loss.detach().reshape(())
            if self.nonfinite_check_every == 1:
                value = float(loss)  # sync point: one per step, as logging the loss costs
                if not math.isfinite(value):
                    self._kill_nonfinite(step, value)
                return
            bad = ~torch.isfinite(loss)
            first, value = self._pending_bad or (
                torch.full((), math.inf, dtype=torch.float64, device=loss.device),
                torch.zeros((), dtype=loss.dtype, device=loss.device),
            )
            newly = bad & torch.isinf(first)
            self._pending_bad = (
                torch.where(newly, float(step), first),
                torch.where(newly, loss, value),
            )
            self._num_since_check += 1
            if self._num_since_check >= self.nonfinite_check_every:
                self._resolve_pending()
            return
        value = float(loss)
        if not math.isfinite(value):
            self._kill_nonfinite(step, value)

    def _resolve_pending(self) -> None:
        self._num_since_check = 0
        if self._pending_bad is None:
            return
        first, value = self._pending_bad
        first_step = float(first)  # sync point: once every nonfinite_check_every steps
        if math.isfinite(first_step):
            self._kill_nonfinite(int(first_step), float(value))

    def _kill_nonfinite(self, step: int, value: float) -> None:
        self._kill(
            "nonfinite_loss",
            step,
            f"the loss is {value} at step {step}",
            {"loss": str(value), "first_bad_step": step, "checked_at_step": self._last_step},
        )

    def _time(self, step: int) -> None:
        now = self.clock()
        if self._last_time is not None and not self._skip_interval:
            if step > self.step_time_warmup_steps:
                self._window_durations.append(now - self._last_time)
        self._last_time = now
        self._skip_interval = False

    def _close_window(self, last_step: int, memory: MemoryWindow | None) -> None:
        durations = self._window_durations
        median = quantile(durations, 0.5) if len(durations) >= 1 else None
        window = GuardWindow(self._window_first, last_step, memory, median, len(durations))
        self.windows.append(window)
        self._window_first, self._window_durations, self._window_num_steps = None, [], 0
        self._emit(
            {
                "event": "window",
                "first_step": window.first_step,
                "last_step": window.last_step,
                "window_peak_bytes": None if memory is None else memory.window_peak_bytes,
                "lifetime_peak_bytes": None if memory is None else memory.lifetime_peak_bytes,
                "median_step_s": median,
                "num_timed_steps": window.num_timed_steps,
            }
        )
        if memory is not None and self.mem_gate_bytes is not None:
            if memory.window_peak_bytes > self.mem_gate_bytes:
                self._kill(
                    "memory_gate",
                    last_step,
                    f"the peak allocated in steps {window.first_step}-{last_step} is "
                    f"{memory.window_peak_bytes / GIB:.2f} GiB, above the gate of "
                    f"{self.mem_gate_bytes / GIB:.2f} GiB",
                    {
                        "window_peak_bytes": memory.window_peak_bytes,
                        "lifetime_peak_bytes": memory.lifetime_peak_bytes,
                        "mem_gate_bytes": self.mem_gate_bytes,
                        "first_step": window.first_step,
                        "last_step": last_step,
                    },
                )
        self._judge_step_time(window)

    def _judge_step_time(self, window: GuardWindow) -> None:
        # a reference needs a full window of intervals; a short one (the loop's first) waits
        if self.step_time_max_ratio is None or window.median_step_s is None:
            return
        if self._reference_step_s is None:
            if window.num_timed_steps >= self.window_steps - 1:
                self._reference_step_s = window.median_step_s
            return
        ratio = window.median_step_s / self._reference_step_s
        if ratio > self.step_time_max_ratio:
            self._kill(
                "step_time_regression",
                window.last_step,
                f"the median step time of steps {window.first_step}-{window.last_step} is "
                f"{window.median_step_s * 1e3:.4g} ms, {ratio:.3g}x the first window's "
                f"{self._reference_step_s * 1e3:.4g} ms (limit {self.step_time_max_ratio:g}x)",
                {
                    "median_step_s": window.median_step_s,
                    "reference_median_step_s": self._reference_step_s,
                    "ratio": ratio,
                    "max_ratio": self.step_time_max_ratio,
                },
            )

    def step(self, step: int, loss: Any = None) -> None:
        """Call once after each optimizer step; raises RunKilled when a kill line fires."""
        self._refuse_after_kill()
        if not self.banner_checked:
            raise LeversError(
                "a dataset banner is declared: call guard.check_banner(counts) before the "
                "first step"
            )
        if not self._started:
            self._start()
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"steps must increase: step {step} after {self._last_step}")
        self._last_step = step
        self._time(step)
        self._check_loss(step, loss)
        if self._window_first is None:
            self._window_first = step
        self._window_num_steps += 1
        memory = None if self.memory is None else self.memory.observe(step)
        if self._window_num_steps >= self.window_steps:
            self._close_window(step, memory)

    def eval(self, step: int, metrics: Mapping[str, float]) -> None:
        """Call after each evaluation; raises RunKilled when a metric bar's streak completes."""
        self._refuse_after_kill()
        if not self._started:
            self._start()
        self._skip_interval = True  # the next step interval holds this evaluation
        values = {name: float(v) for name, v in metrics.items()}
        self._emit({"event": "eval", "step": step, "metrics": values})
        for bar in self.metric_bars:
            if bar.name not in values or step <= bar.after_step:
                continue
            streak = self._streaks[bar.name]
            if bar.is_worse(values[bar.name]):
                streak.append((step, values[bar.name]))
            else:
                streak.clear()
            if len(streak) >= bar.num_evals:
                worse = "above" if bar.better == "lower" else "below"
                self._kill(
                    "metric_bar",
                    step,
                    f"{bar.name} is {worse} {bar.bar:g} for {len(streak)} evals in a row after "
                    f"step {bar.after_step} ({', '.join(f'{v:.6g} @ {s}' for s, v in streak)})",
                    {
                        "metric": bar.name,
                        "bar": bar.bar,
                        "better": bar.better,
                        "evals": [{"step": s, "value": v} for s, v in streak],
                    },
                )

    # ---- end of run --------------------------------------------------------------------------

    def close(self) -> GuardKill | None:
        """Resolve pending checks, log the last partial window and record the end of the run.

        Returns the kill, if any (one found here, by a deferred loss check or in the last
        partial window, is recorded and returned, not raised).
        """
        if self._closed:
            return self.killed
        self._closed = True
        if self._started and self.killed is None:
            try:
                if self._pending_bad is not None:
                    self._resolve_pending()
                if self._window_num_steps:
                    memory = None if self.memory is None else self.memory.flush(self._last_step)
                    self._close_window(self._last_step, memory)
            except RunKilled:
                pass  # recorded by _kill; reported through the return value and guard.killed
        self._emit(
            {
                "event": "guard_end",
                "last_step": self._last_step,
                "killed": None if self.killed is None else asdict(self.killed),
                "lifetime_peak_bytes": None
                if self.memory is None
                else self.memory.lifetime_peak_bytes,
            }
        )
        return self.killed

    def __enter__(self) -> RunGuard:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc_type is None:
            self.close()
            return False
        if isinstance(exc, RunKilled) and exc.kill is self.killed:
            self.close()
            return True  # the kill is recorded and the run stopped: the block ends cleanly
        return False
