"""Options shared by several verbs, each declared once here, with one spelling and one meaning.

- ``WORKLOAD``: a workload spec (:func:`add_workload_argument`), the same forms in every verb.
- ``--set KEY=VALUE``: a factory parameter (:func:`add_set_argument`).
- ``--gpu GPU``: the GPU a CPU run is estimated or predicted for (:func:`add_gpu_argument`); one
  default, :data:`levers.hardware.DEFAULT_GPU`, for the audit and the memory model.
  ``--target`` is its older spelling in ``levers audit``.
- ``--warmup N``: steps run first and not measured; ``--steps N``: steps measured after them
  (timed in audit, ab and tune). ``levers audit --timed`` is the older spelling of its
  ``--steps``; ``levers memory``'s steps, which are predicted rather than timed, are
  ``--predict-steps`` (``--steps`` kept there as its older spelling).
- ``--json``/``--md``/``--html FILE``: write the verb's result in that format
  (:func:`add_output_arguments`).
- Byte sizes (``40GiB``, ``512MiB``) are read by :func:`levers.units.parse_bytes` alone.

This module imports no torch: ``levers --help`` builds every verb's parser.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from levers.errors import LeversError
from levers.hardware import DEFAULT_GPU

WORKLOAD_FORMS = "a built-in name (demo, llama, hf), path/to/file.py:factory or package.module:factory"

OUTPUT_FORMATS = {
    "json": "JSON",
    "md": "Markdown",
    "html": "one self-contained HTML page (no network needed)",
}


def count(text: str) -> int:
    """A whole number >= 0 (steps, resamples): the ``type=`` of a count option."""
    return _whole_number(text, minimum=0)


def positive_count(text: str) -> int:
    """A whole number >= 1 (rows in a table): the ``type=`` of a count that cannot be zero."""
    return _whole_number(text, minimum=1)


def positive_seconds(text: str) -> float:
    """A duration in seconds above 0 (a timeout): the ``type=`` of such an option."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value


def _whole_number(text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def add_workload_argument(
    parser: Any,
    dest: str = "workload",
    *,
    metavar: str = "WORKLOAD",
    help: str | None = None,
) -> None:
    """The optional ``WORKLOAD`` positional: a spec that :func:`levers.loader.load` reads."""
    parser.add_argument(
        dest,
        nargs="?",
        default=None,
        metavar=metavar,
        help=help or WORKLOAD_FORMS,
    )


class _SetItems(argparse.Action):
    """``--set``'s items, in order, from every ``--set`` given. A key given again with another
    value is the later one's (as a later command-line option overrides an earlier one), and
    levers says so on stderr: ``--set hidden=8 hidden=32`` is more often a slip than a wish."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        items = list(getattr(namespace, self.dest, None) or [])
        given = {item.partition("=")[0].strip(): item for item in items}
        for item in values:
            key = item.partition("=")[0].strip()
            earlier = given.get(key)
            if earlier is not None and earlier != item:
                print(
                    f"levers: warning: {option_string} {key} is given twice ({earlier}, then "
                    f"{item}); the last one is used",
                    file=sys.stderr,
                )
            given[key] = item
        setattr(namespace, self.dest, items + list(values))


def add_set_argument(
    parser: Any, flag: str = "--set", *, dest: str = "set_items", help: str | None = None
) -> None:
    """Add a ``--set KEY=VALUE ...`` option (read with :func:`parse_set`) to an argparse parser."""
    parser.add_argument(
        flag,
        dest=dest,
        nargs="+",
        action=_SetItems,
        default=[],
        metavar="KEY=VALUE",
        help=help
        or "a factory parameter; values are Python literals (4, 1e-3, True) or plain strings (1b)",
    )


def add_gpu_argument(
    parser: Any,
    *,
    what: str,
    budget: bool = False,
    older_spelling: str | None = None,
    dest: str = "gpu",
) -> None:
    """``--gpu GPU`` (default None, so that a verb can tell that none was asked; it then takes
    :data:`~levers.hardware.DEFAULT_GPU`). ``budget``: a memory budget such as 40GiB is taken
    too. ``older_spelling``: a flag kept as an alias for scripts that use it."""
    flags = ["--gpu", *([older_spelling] if older_spelling else [])]
    names = "h100-80gb, h100, h200, a100, a100-40gb, ..." + (" | a budget such as 40GiB" if budget else "")
    alias = f"; {older_spelling} is its older spelling" if older_spelling else ""
    parser.add_argument(
        *flags,
        dest=dest,
        default=None,
        metavar="GPU",
        help=f"{what}: {names} (default: {DEFAULT_GPU}, the part the family name h100 stands for; "
        f"the same default in levers audit and levers memory, so that their figures are for one "
        f"GPU){alias}",
    )


def add_warmup_argument(parser: Any, *, default: str) -> None:
    """``--warmup N``: steps run first and not measured. ``default`` says what it is in this verb
    (the value itself is applied by the verb, which may differ for a script after ``--``)."""
    parser.add_argument(
        "--warmup",
        type=count,
        default=None,
        metavar="N",
        help=f"steps run first and not measured (a script's steps are its optimizer steps); "
        f"default: {default}",
    )


def add_steps_argument(parser: Any, *, default: str, older_spelling: str | None = None) -> None:
    """``--steps N``: the timed steps, after ``--warmup``."""
    flags = ["--steps", *([older_spelling] if older_spelling else [])]
    alias = f"; {older_spelling} is its older spelling" if older_spelling else ""
    parser.add_argument(
        *flags,
        dest="steps",
        type=count,
        default=None,
        metavar="N",
        help=f"steps timed after the warm-up; default: {default}{alias}",
    )


# the FILE of an output option given without one, where the verb allows it: standard output
STDOUT = Path("-")


def output_path(text: str) -> Path:
    """An output FILE argument, made absolute against the directory levers started in, so that
    a script that changes directory (``os.chdir``) before levers writes does not move it;
    ``-`` stays :data:`STDOUT`."""
    path = Path(text)
    return path if path == STDOUT else Path.cwd() / path


def add_predict_steps_argument(parser: Any, *, default: int) -> None:
    """``levers memory --predict-steps N``: training steps the memory model runs after the
    build (predicted, not timed, so not ``--steps``, which is kept as its older spelling).
    Its value is None when not given (so that a verb can tell); ``default`` is the verb's."""
    parser.add_argument(
        "--predict-steps",
        "--steps",
        dest="predict_steps",
        type=count,
        default=None,
        metavar="N",
        help=f"training steps predicted after the build; the peaks cover them all (default: "
        f"{default}); --steps is its older spelling",
    )


def add_output_arguments(parser: Any, *, stdout: bool = False, **what: str) -> None:
    """``--json FILE``, ``--md FILE``, ``--html FILE`` (those named), each read into
    ``<format>_path``; ``what`` says what the verb writes (``json="the plan"``). ``stdout``:
    FILE may be left out (or be ``-``) to print to standard output (:data:`STDOUT`)."""
    for name, thing in what.items():
        parser.add_argument(
            f"--{name}",
            dest=f"{name}_path",
            type=output_path,
            metavar="FILE",
            **({"nargs": "?", "const": STDOUT} if stdout else {}),
            help=f"write {thing} to FILE as {OUTPUT_FORMATS[name]}"
            + ("; without FILE (or with -), print it" if stdout else ""),
        )


def add_lever_argument(parser: Any, *, help: str, metavar: str = "NAME") -> None:
    """``--lever`` (repeatable) into ``args.levers``, read as ids by :func:`lever_ids`."""
    parser.add_argument(
        "--lever", dest="levers", action="append", default=[], metavar=metavar, help=help
    )


def lever_ids(given: list[str], flag: str = "--lever") -> list[str]:
    """``--lever a,b --lever c`` (and ``--exclude``) as lever ids, in order.

    Raises:
        LeversError: a value that names no lever (``--lever ""``): it would read as no
            ``--lever`` at all, which means every lever to tune.
    """
    ids = []
    for value in given:
        parts = [part.strip() for part in value.split(",") if part.strip()]
        if not parts:
            raise LeversError(
                f"{flag} {value!r} names no lever; name one or more (levers list shows them), "
                f"or leave {flag} out"
            )
        ids += parts
    return ids
