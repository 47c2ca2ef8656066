"""Whether a capture is of a script run after ``levers audit --`` (one step of a running loop).

A factory's step is one function called again and again; a script's captured step is one
iteration of a loop that may differ from step to step (a log line every N steps) and that no
workload spec builds again. Claims and commands that depend on that read it here.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from typing import Any

from levers.capture.records import Capture
from levers.script_defaults import TUNE_SCRIPT_STEPS

# a script's options that commonly say how many optimizer steps it runs
_STEPS_OPTION = re.compile(
    r"^--(steps|max[-_]steps|num[-_]steps|train[-_]steps|total[-_]steps|iters|max[-_]iters|"
    r"num[-_]iters|iterations|max[-_]iterations|num[-_]iterations)$"
)


def script_command(capture: Capture) -> str | None:
    """The ``python train.py ...`` a script capture ran (after ``levers audit --``), else None."""
    command = capture.workload_params.get("command")
    return command if isinstance(command, str) and command.startswith("python") else None


def tune_script_command(command: str) -> tuple[str, str]:
    """(``levers tune -- COMMAND``, a note on the optimizer steps it needs) for the script
    ``command`` (``python train.py ...``).

    Each run of ``levers tune -- python train.py`` goes to the script's optimizer step
    :data:`~levers.script_defaults.TUNE_SCRIPT_STEPS` with tune's defaults; a script that ends
    before that is refused. Where the command sets its steps with an option that reads as one
    (``--steps 6``, ``--max_steps=8``) below that, the command printed raises it, so that it runs
    as printed; else the note says what the script must run.
    """
    try:
        words = shlex.split(command)
    except ValueError:  # the command is recorded joined by spaces: a lone quote in an argument
        words = command.split()
    for i, word in enumerate(words):
        flag, equals, value = word.partition("=")
        if not _STEPS_OPTION.match(flag):
            continue
        if not equals:
            value = words[i + 1] if i + 1 < len(words) else ""
        if not value.isdigit():
            break
        if int(value) >= TUNE_SCRIPT_STEPS:
            return _tune(words), ""
        raised = f"{flag}={TUNE_SCRIPT_STEPS}" if equals else str(TUNE_SCRIPT_STEPS)
        at = i if equals else i + 1
        words = [*words[:at], raised, *words[at + 1:]]
        return _tune(words), (
            f"{flag} {value} raised to {TUNE_SCRIPT_STEPS}: each of its A/Bs runs the script "
            f"to its optimizer step {TUNE_SCRIPT_STEPS}"
        )
    return _tune(words), (
        f"each of its A/Bs runs the script to its optimizer step {TUNE_SCRIPT_STEPS}: let the "
        "script run at least that many"
    )


def _tune(words: list[str]) -> str:
    return "levers tune -- " + " ".join(shlex.quote(word) for word in words)
# the capture's setting that holds the script's names for its model and optimizer
# (levers.integrations.script_names.ScriptNames, as a dict)
SCRIPT_NAMES = "script_names"
HF_TRAINER = "transformers"


def script_names(capture: Capture) -> dict[str, Any] | None:
    """The names a script capture found for its model and optimizer, else None."""
    names = capture.settings.get(SCRIPT_NAMES)
    return dict(names) if isinstance(names, dict) else None


def runs_hf_trainer(names: Mapping[str, Any] | None) -> bool:
    """Whether a Hugging Face Trainer ran the captured loop."""
    return bool(names) and names.get("framework") == HF_TRAINER


def trainer_callback(stack: str) -> tuple[str, str]:
    """How a Trainer script applies ``stack``, and what it does: the callback that applies it
    when training begins, to the model and the optimizer the Trainer builds."""
    return (
        f'Trainer(..., callbacks=[LeversCallback(levers="{stack}")])',
        "from levers.integrations.transformers import LeversCallback: applied to the Trainer's "
        "model and optimizer when training begins, undone when it ends",
    )


def apply_call(
    names: Mapping[str, Any] | None, stack: str, *, step: str | None = None
) -> tuple[str, str]:
    """``levers.apply(net, "A,B", optimizer=opt)`` with the script's own names, and what the
    reader must fill in where a name was not found ("" when none is missing). ``names`` None
    (not a script capture): the conventional ``model`` and ``optimizer``."""
    if names is None:
        names = {"model": "model", "optimizer": "optimizer"}
    model = names.get("model") or "model"
    optimizer = names.get("optimizer")
    args = [model, f'"{stack}"']
    missing = []
    if optimizer:
        args.append(f"optimizer={optimizer}")
    else:
        missing.append(
            f"add optimizer= with the {names.get('optimizer_class') or 'optimizer'} the script "
            "steps, for the levers that change it (no variable of the script holds it)"
        )
    if step:
        args.append(f"step={step}")
    if not names.get("model"):
        missing.insert(0, (
            f"model is the {names.get('model_class') or 'nn.Module'} the script trains (no "
            "variable of the script holds it)"
        ))
    return f"levers.apply({', '.join(args)})", "; ".join(missing)
