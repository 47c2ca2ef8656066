"""Zero-code capture: run an unchanged training script in this process and capture one of its
steps, as ``py-spy record -- python train.py`` or ``nsys profile python train.py`` would.

    levers audit [levers options] -- python train.py [its arguments]
    levers audit [levers options] -- python -m pkg.train [its arguments]

The script runs as ``python`` would run it: ``__name__ == "__main__"``, its own ``sys.argv``, its
directory (for ``-m``, the current directory) first on ``sys.path``, the warning filters of its
``-W`` options (``-u`` and ``-B`` change nothing here; ``-O`` cannot apply in this process, which
is said, and other interpreter options are refused). Its output is its own. Step
boundaries come from ``optimizer.step()`` (:mod:`levers.integrations.steps`); after the warm-up
steps the next whole step is captured, and then the script is stopped (a private exception out
of the optimizer hook) unless ``keep_running`` is set.

When the script fails, its traceback is printed as Python prints it (without levers' and
runpy's frames) and its exit code is kept: 1 for an exception, the code of a ``SystemExit``.
"""

from __future__ import annotations

import contextlib
import os
import re
import runpy
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from levers.capture.records import Capture
from levers.errors import LeversError
from levers.script_defaults import SCRIPT_TIMED, SCRIPT_WARMUP
from levers.integrations.steps import StepWatcher, StopTraining
from levers.optional import torchvision_without_ops
from levers.workload import Workload

DEFAULT_WARMUP = SCRIPT_WARMUP
DEFAULT_TIMED = SCRIPT_TIMED
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
# interpreter options that change nothing levers needs to imitate
_IGNORED_PYTHON_FLAGS = {"-u", "-B"}
# -O and -OO strip assert statements when python compiles; the script's modules are compiled in
# levers' process, which was started without them
_OPTIMIZE_FLAGS = {"-O", "-OO"}
OPTIMIZE_NOTE = (
    "python {flag} cannot apply to a script run in levers' own process: its assert statements "
    "run (and __debug__ is True); the rest of the step is as it would be"
)


@dataclass(frozen=True)
class ScriptCommand:
    """What follows ``--``: a script path or a module name, and the script's own arguments.

    ``flags`` are the interpreter options given before it that levers applies or notes (``-W``
    warning filters are applied while the script runs; ``-O`` is noted: see ``notes``).
    """

    target: str
    is_module: bool
    args: tuple[str, ...]
    flags: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # what levers could not apply of the command, one line each

    @property
    def words(self) -> list[str]:
        """The command without the script's own arguments: ``python [flags] train.py``."""
        head = ["-m", self.target] if self.is_module else [self.target]
        return ["python", *self.flags, *head]

    @property
    def warning_options(self) -> tuple[str, ...]:
        """The ``-W`` options, in order, each as Python's ``-W`` reads it."""
        flags = list(self.flags)
        return tuple(flags[i + 1] for i, flag in enumerate(flags) if flag == "-W")

    @property
    def display(self) -> str:
        return " ".join([*self.words, *self.args])


@dataclass(frozen=True)
class ScriptRun:
    """How a script run ended.

    Attributes:
        capture: the captured step, or None when the run ended before one was captured.
        workload: the model and optimizer found (a Workload whose step the script runs).
        num_steps: optimizer steps seen.
        exit_code: the script's own exit code; 0 when levers stopped it after the capture.
        stopped: levers stopped the script after the capture.
        saw: one line on how far the run got (for a run that captured nothing).
        error: the script's exception as Python's last traceback line says it, or None.
    """

    capture: Capture | None
    workload: Workload | None
    num_steps: int
    exit_code: int
    stopped: bool
    saw: str
    error: str | None = None


def parse_command(words: list[str]) -> ScriptCommand:
    """Parse ``python [-u] script.py args`` or ``python -m module args`` (or ``script.py args``)."""
    usage = (
        "after --, give the command that runs your training: -- python train.py [args] or "
        "-- python -m package.train [args]"
    )
    if not words:
        raise LeversError(f"nothing after --; {usage}")
    rest = list(words)
    flags: list[str] = []
    notes: list[str] = []
    if _PYTHON.match(os.path.basename(rest[0])) or rest[0] == sys.executable:
        rest.pop(0)
        while rest and (
            rest[0] in _IGNORED_PYTHON_FLAGS or rest[0] in _OPTIMIZE_FLAGS
            or rest[0].startswith("-W")
        ):
            flag = rest.pop(0)
            if flag in _OPTIMIZE_FLAGS:
                flags.append(flag)
                notes.append(OPTIMIZE_NOTE.format(flag=flag))
            elif flag.startswith("-W"):
                option = flag[2:] if flag != "-W" else (rest.pop(0) if rest else "")
                _check_warning_option(option, usage)
                flags += ["-W", option]
        if rest and rest[0] == "-m":
            if len(rest) < 2:
                raise LeversError(f"python -m needs a module name; {usage}")
            return ScriptCommand(
                target=rest[1], is_module=True, args=tuple(rest[2:]), flags=tuple(flags),
                notes=tuple(notes),
            )
        if rest and rest[0].startswith("-"):
            raise LeversError(
                f"levers runs the script in its own process and cannot apply the python option "
                f"{rest[0]!r}; drop it ({usage})"
            )
    elif not rest[0].endswith(".py"):
        raise LeversError(f"{rest[0]!r} is not python or a .py file; {usage}")
    if not rest:
        raise LeversError(f"no script after python; {usage}")
    path = Path(rest[0])
    if not path.is_file():
        raise LeversError(f"no such script: {rest[0]}; check the path (relative to {os.getcwd()})")
    return ScriptCommand(
        target=str(path), is_module=False, args=tuple(rest[1:]), flags=tuple(flags),
        notes=tuple(notes),
    )


def _check_warning_option(option: str, usage: str) -> None:
    """Refuse a ``-W`` option that Python would refuse, before the script runs."""
    if not option:
        raise LeversError(
            f"python -W needs an argument (-W ignore, -W error::DeprecationWarning); {usage}"
        )
    with warnings.catch_warnings():
        try:
            _set_warning_option(option)
        except warnings._OptionError as exc:  # the interpreter's own -W error
            raise LeversError(f"python -W {option}: {exc}; {usage}") from None


def _set_warning_option(option: str) -> None:
    # Python's own reader of -W (action:message:category:module:lineno), private but in every
    # CPython since 2.1: the filter is then exactly what `python -W option` installs
    warnings._setoption(option)  # type: ignore[attr-defined]


def run_script(
    command: ScriptCommand,
    *,
    warmup: int = DEFAULT_WARMUP,
    timed: int = DEFAULT_TIMED,
    keep_running: bool = False,
    tokens_per_step: int | None = None,
    progress: Callable[[int, str], None] | None = None,
    on_step: Callable[[int, Any], None] | None = None,
    on_captured: Callable[[Capture, Workload], None] | None = None,
) -> ScriptRun:
    """Run the script, capture one whole step after ``warmup`` (+ ``timed``) optimizer steps.

    ``on_step(num_steps, optimizer)`` is called at every step boundary (see
    :class:`levers.integrations.steps.StepWatcher`). ``on_captured(capture, workload)`` is
    called as soon as the step is captured, inside the script's ``optimizer.step()``, before the
    script goes on (``keep_running``) or is stopped; what it raises stops the script and is
    raised again here, after the script's environment is put back. A KeyboardInterrupt
    propagates (the CLI turns it into exit 130).
    """
    failed: list[BaseException] = []  # what on_captured raised

    def captured(capture: Capture) -> None:
        if on_captured is not None:
            assert watcher.workload is not None  # set before any capture
            try:
                with _outside_the_step():
                    on_captured(capture, watcher.workload)
            except BaseException as exc:  # noqa: BLE001 - levers' own: not the script's to see
                failed.append(exc)
                raise StopTraining from None
        if not keep_running:
            raise StopTraining

    watcher = StepWatcher(
        warmup=warmup,
        timed=timed,
        name=_name_of(command),
        params={"command": command.display},
        tokens_per_step=tokens_per_step,
        on_captured=captured,
        progress=progress,
        on_step=on_step,
    )
    stopped = False
    exit_code = 0
    error = None
    # under LEVERS_TORCHVISION_WITHOUT_OPS=1, the script's transformers or timm imports past a
    # torchvision whose compiled operators do not load, as levers' own imports do
    torchvision_without_ops()
    with watcher, _script_environment(command):
        try:
            if command.is_module:
                runpy.run_module(command.target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(command.target, run_name="__main__")
        except StopTraining:
            stopped = True
        except SystemExit as exc:
            exit_code = _exit_code_of(exc)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - the script's own failure, shown as its own
            _print_script_traceback(exc)
            exit_code = 1
            error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        finally:
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                pass  # the reader has gone (| head): levers' own output meets it next
    if failed:
        raise failed[0]
    return ScriptRun(
        capture=watcher.capture,
        workload=watcher.workload,
        num_steps=watcher.num_steps,
        exit_code=exit_code,
        stopped=stopped,
        saw=watcher.saw(),
        error=error,
    )


@contextlib.contextmanager
def _outside_the_step() -> Iterator[None]:
    """Gradients on and autocast off, as at a script's top level: ``on_captured`` runs inside
    the script's ``optimizer.step()``, which a script may call under ``torch.no_grad()`` or
    inside its autocast region, and what it runs (the audit's microbenchmarks of a fix) must not
    run under them."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.enable_grad())
        for device_type in ("cpu", "cuda"):
            if torch.is_autocast_enabled(device_type):
                stack.enter_context(torch.autocast(device_type, enabled=False))
        yield


def _name_of(command: ScriptCommand) -> str:
    return command.target if command.is_module else os.path.basename(command.target)


class _script_environment:
    """``sys.argv``, ``sys.path[0]`` and the ``-W`` warning filters as ``python`` sets them,
    restored afterwards."""

    def __init__(self, command: ScriptCommand) -> None:
        self.command = command

    def __enter__(self) -> None:
        self._argv = sys.argv
        self._path = list(sys.path)
        # -W options: the script's warning filters, put back as they were afterwards
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        for option in self.command.warning_options:
            _set_warning_option(option)
        if self.command.is_module:
            sys.argv = ["-m", *self.command.args]  # runpy puts the module's file in argv[0]
            sys.path.insert(0, os.getcwd())
        else:
            sys.argv = [self.command.target, *self.command.args]
            sys.path.insert(0, os.path.dirname(os.path.abspath(self.command.target)))

    def __exit__(self, *exc: Any) -> None:
        sys.argv = self._argv
        sys.path[:] = self._path
        self._warnings.__exit__(*exc)


def _exit_code_of(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


_RUNNER_FILES = (os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>")
# levers' own package: its capture modes and hooks sit between the script and torch while a step
# is captured, and a frame of theirs in the script's traceback would read as levers' failure
_LEVERS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _runner_frame(filename: str) -> bool:
    if filename.startswith("<"):
        return filename in _RUNNER_FILES
    path = os.path.abspath(filename)
    return path in _RUNNER_FILES or path.startswith(_LEVERS_DIR)


def _print_script_traceback(exc: BaseException) -> None:
    """The traceback Python would print for the script, without runpy's and levers' frames (of
    the exception and of those chained to it)."""
    sys.stdout.flush()
    shown = traceback.TracebackException.from_exception(exc)
    raised_in_levers = bool(shown.stack) and _in_levers(shown.stack[-1].filename)
    if not raised_in_levers:
        _drop_runner_frames(shown, set())
    sys.stderr.write("".join(shown.format()))
    if raised_in_levers:  # levers' own hook failed: its frames are the evidence, not noise
        sys.stderr.write(
            "levers: this error was raised inside levers, not by the script (a defect in "
            "levers: please report it with the traceback above)\n"
        )
    sys.stderr.flush()


# the capture's observers call the op the script called: an error that torch raises there (a
# shape mismatch) is the script's, so these frames do not make an error levers' own
_PASS_THROUGH_DIR = os.path.join(_LEVERS_DIR, "capture") + os.sep


def _in_levers(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    return path.startswith(_LEVERS_DIR) and not path.startswith(_PASS_THROUGH_DIR)


def _drop_runner_frames(shown: traceback.TracebackException, seen: set[int]) -> None:
    if id(shown) in seen:  # a chain that loops back on itself
        return
    seen.add(id(shown))
    kept = [frame for frame in shown.stack if not _runner_frame(frame.filename)]
    shown.stack = traceback.StackSummary.from_list(kept)
    for chained in (shown.__cause__, shown.__context__):
        if chained is not None:
            _drop_runner_frames(chained, seen)
