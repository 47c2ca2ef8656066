"""Whether a capture is of a script run after ``levers audit --`` (one step of a running loop).

A factory's step is one function called again and again; a script's captured step is one
iteration of a loop that may differ from step to step (a log line every N steps) and that no
workload spec builds again. Claims and commands that depend on that read it here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from levers.capture.records import Capture


def script_command(capture: Capture) -> str | None:
    """The ``python train.py ...`` a script capture ran (after ``levers audit --``), else None."""
    command = capture.workload_params.get("command")
    return command if isinstance(command, str) and command.startswith("python") else None


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
