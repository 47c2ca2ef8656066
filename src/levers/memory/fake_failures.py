"""When a step cannot run on fake tensors: keep torch's own error logs off the terminal, and say
in one line what failed and whose fix it is.

Torch logs every meta kernel that fails under ``FakeTensorMode`` (``failed while attempting to
run meta for ...`` and a full traceback, through the ``torch`` loggers' stderr handler), and a
DataLoader's worker processes log the same from each worker. Those lines are about levers' fake
run, not the user's: :func:`torch_logs_captured` holds them while a prediction runs (worker
processes forked inside it inherit the capturing handler), and they are shown only under
``--debug`` (:func:`failure_detail`) or ``LEVERS_DEBUG=1`` (then they are not captured at all).

Some failures are the workload's to fix, not levers' (:func:`user_fix`): a DataLoader with worker
processes (fake tensors cannot cross a process boundary) and a custom op without a fake kernel
(its output's shape is unknown without running it). Their message says what to change and does
not ask for a bug report.
"""

from __future__ import annotations

import contextlib
import logging
import re
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field

from torch._subclasses.fake_tensor import UnsupportedOperatorException

from levers.output.errors import debug_from_env

TORCH_LOGGER = "torch"
# the attribute a failed prediction's exception carries torch's captured log lines in
LOG_LINES_ATTRIBUTE = "levers_torch_log_lines"
# the most captured lines kept for --debug (each failing meta kernel logs about ten)
MAX_LOG_LINES = 400


@dataclass
class CapturedLogs:
    lines: list[str] = field(default_factory=list)


class _CaptureHandler(logging.Handler):
    def __init__(self, captured: CapturedLogs) -> None:
        super().__init__(level=logging.NOTSET)
        self.captured = captured
        self._last: logging.LogRecord | None = None
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        # one record reaches this handler once per logger it propagates through
        if record is self._last or len(self.captured.lines) >= MAX_LOG_LINES:
            return
        self._last = record
        try:
            self.captured.lines.extend(self.format(record).splitlines())
        except Exception:  # noqa: BLE001 - a log line must never break the prediction
            pass


def _torch_loggers() -> list[logging.Logger]:
    """``torch`` and its children that have handlers of their own (torch._logging gives them)."""
    found = [logging.getLogger(TORCH_LOGGER)]
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if name.startswith(TORCH_LOGGER + ".") and isinstance(logger, logging.Logger):
            if logger.handlers:
                found.append(logger)
    return found


@contextlib.contextmanager
def torch_logs_captured() -> Iterator[CapturedLogs]:
    """Route torch's log records into memory while the block runs; restore the handlers after.

    An exception leaving the block carries the lines as ``levers_torch_log_lines``. Under
    ``LEVERS_DEBUG=1`` nothing is captured: torch's lines reach stderr as they happen.
    """
    captured = CapturedLogs()
    if debug_from_env():
        yield captured
        return
    handler = _CaptureHandler(captured)
    saved = []
    # every torch logger that prints takes the capturing handler in place of its own (one that
    # does not propagate must keep a handler, or Python's last-resort handler prints its records)
    for logger in _torch_loggers():
        saved.append((logger, list(logger.handlers), logger.propagate))
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
    # records that would have gone on to the root logger (a user's logging.basicConfig) are
    # held here too
    logging.getLogger(TORCH_LOGGER).propagate = False
    try:
        yield captured
    except BaseException as exc:
        with contextlib.suppress(Exception):
            setattr(exc, LOG_LINES_ATTRIBUTE, list(captured.lines))
        raise
    finally:
        for logger, handlers, propagate in saved:
            logger.removeHandler(handler)
            for old in handlers:
                logger.addHandler(old)
            logger.propagate = propagate


_NO_FAKE_IMPL = re.compile(r"no fake impl registered for <CustomOpDef\((?P<op>[\w.:]+)\)>")
_NO_META = re.compile(r"[Cc]ould not run '(?P<op>[\w.:]+)' with arguments from the 'Meta' backend")
DATALOADER_WORKER = "in DataLoader worker process"


def _op_without_fake_kernel(exc: BaseException) -> str | None:
    """The custom op that has no fake (meta) kernel, if that is why ``exc`` was raised."""
    text = str(exc)
    for pattern in (_NO_FAKE_IMPL, _NO_META):
        match = pattern.search(text)
        if match:
            return match.group("op")
    if isinstance(exc, UnsupportedOperatorException):
        return str(exc.func)
    return None


def user_fix(exc: BaseException) -> str | None:
    """What the workload's author can change so that the step runs on fake tensors, or None
    when the failure is not one of theirs to fix."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if DATALOADER_WORKER in str(exc):
            return (
                "the step reads a DataLoader with worker processes (num_workers > 0), and fake "
                "tensors cannot cross into them; build the DataLoader with num_workers=0 when "
                "the factory is called for levers memory (e.g. a num_workers factory parameter, "
                "--set num_workers=0)"
            )
        op = _op_without_fake_kernel(exc)
        if op is not None:
            return (
                f"the custom op {op} has no fake kernel, so its output's shape and dtype are "
                f"unknown without running it; register one with "
                f"torch.library.register_fake({op.split('.')[0]!r}) (or @<op>.register_fake) "
                "that returns an empty tensor of the output's shape"
            )
        exc = exc.__cause__ or exc.__context__
    return None


def first_line(exc: BaseException) -> str:
    """``Type: first line of the message`` (a DataLoader worker's message holds a traceback)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": .")


def failure_detail(exc: BaseException) -> str:
    """For ``--debug``: torch's captured log lines, then the full exception."""
    lines = list(getattr(exc, LOG_LINES_ATTRIBUTE, ()) or ())
    parts = []
    if lines:
        parts.append("torch logged, while levers ran the step on fake tensors:\n" + "\n".join(lines))
    parts.append("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
    return "\n".join(parts)
