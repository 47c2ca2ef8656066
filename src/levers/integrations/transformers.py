"""``LeversCallback`` for the Hugging Face ``Trainer``: audit step N, write the report next to the
run's output.

    from levers.integrations.transformers import LeversCallback
    trainer = Trainer(..., callbacks=[LeversCallback(step=3)])

After step N the report is in ``<args.output_dir>/levers/`` (audit.md, audit.html, capture.json,
trace.json); ``callback.audited`` holds the findings. Needs ``transformers`` (``levers[hf]``).

``LeversCallback(levers="packing")`` also applies levers for the run: when training begins, to
the Trainer's model and optimizer and, for the data levers (packing, padding-free,
pad-to-multiple), to the collate_fn of its training DataLoader (built by then, iterated after);
undone when training ends. ``callback.applied`` is the handle (``levers.apply``'s).
"""

from __future__ import annotations

from typing import Any

from levers.errors import MissingDependency
from levers.integrations.callbacks import DEFAULT_STEP, StepAuditor
from levers.levers.handle import apply

try:
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise MissingDependency(
        "levers.integrations.transformers needs transformers: pip install 'levers[hf]'"
    ) from exc


class LeversCallback(TrainerCallback):
    """Audit optimizer step ``step`` (1-based, >= 2) of the Trainer's run."""

    def __init__(
        self, step: int = DEFAULT_STEP, *, target: str | None = None, levers: Any = None
    ) -> None:
        self._auditor = StepAuditor(step=step, target=target, name="trainer")
        self._levers = levers
        self.applied: Any = None

    @property
    def audited(self) -> Any:
        return self._auditor.audited

    @property
    def written(self) -> Any:
        return self._auditor.written

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._levers and model is not None:
            self.applied = apply(
                model, self._levers, optimizer=kwargs.get("optimizer"),
                data=kwargs.get("train_dataloader"),
            )
        self._auditor.begin(model)

    def on_step_end(self, args, state, control, **kwargs):
        self._auditor.after_step(args.output_dir)

    def on_train_end(self, args, state, control, **kwargs):
        self._auditor.end(args.output_dir)
        if self.applied is not None:
            self.applied.undo()
            self.applied = None
