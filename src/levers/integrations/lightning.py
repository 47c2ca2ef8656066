"""``LeversCallback`` for Lightning: audit step N of ``Trainer.fit``, write the report next to
the run's logs.

    from levers.integrations.lightning import LeversCallback
    trainer = pl.Trainer(..., callbacks=[LeversCallback(step=3)])

The report goes to ``<trainer.log_dir or default_root_dir>/levers/``. Works with either
installation, ``lightning`` (``lightning.pytorch``) or ``pytorch_lightning``: the callback is an
instance of every Callback class installed, so either Trainer accepts it.
"""

from __future__ import annotations

from typing import Any

from levers.errors import MissingDependency
from levers.integrations.callbacks import DEFAULT_STEP, StepAuditor


def _callback_bases() -> tuple[type, ...]:
    bases = []
    try:
        from lightning.pytorch import Callback as LightningCallback

        bases.append(LightningCallback)
    except ImportError:
        pass
    try:
        from pytorch_lightning import Callback as PLCallback

        if PLCallback not in bases:
            bases.append(PLCallback)
    except ImportError:
        pass
    if not bases:
        raise MissingDependency(
            "levers.integrations.lightning needs Lightning: pip install 'levers[lightning]'"
        )
    return tuple(bases)


class LeversCallback(*_callback_bases()):  # type: ignore[misc]
    """Audit optimizer step ``step`` (1-based, >= 2) of the fit."""

    def __init__(self, step: int = DEFAULT_STEP, *, target: str | None = None) -> None:
        super().__init__()
        self._auditor = StepAuditor(step=step, target=target, name="lightning")

    @property
    def audited(self) -> Any:
        return self._auditor.audited

    @property
    def written(self) -> Any:
        return self._auditor.written

    def on_fit_start(self, trainer, pl_module):
        self._auditor.begin(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._auditor.after_step(trainer.log_dir or trainer.default_root_dir)

    def on_fit_end(self, trainer, pl_module):
        self._auditor.end(trainer.log_dir or trainer.default_root_dir)
