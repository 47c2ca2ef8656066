"""inductor's autotuning reports while a compile lever in a max-autotune mode is on: its tables
and statistics off unless the user asked for them, its records of dropped templates filtered,
everything as it was after the undo; the other modes change nothing."""

from __future__ import annotations

import logging

import pytest
import torch
import torch._inductor.config as inductor_config

from levers.levers import load_all
from levers.levers._compile_setup import (
    AUTOTUNE_LOGGER,
    AUTOTUNE_REPORTS,
    DROPPED_CHOICE,
    quiet_autotuning,
)
from levers.levers.lever import Target


def _settings() -> dict[str, object]:
    return {name: getattr(inductor_config, name) for name in AUTOTUNE_REPORTS
            if hasattr(inductor_config, name)}


def _passes(record_message: str) -> bool:
    record = logging.LogRecord(AUTOTUNE_LOGGER, logging.ERROR, __file__, 1, record_message,
                               None, None)
    return all(f.filter(record) for f in logging.getLogger(AUTOTUNE_LOGGER).filters)


@pytest.fixture(autouse=True)
def _no_report_variables(monkeypatch):
    for variable, _ in AUTOTUNE_REPORTS.values():
        monkeypatch.delenv(variable, raising=False)


class _Blocks(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


@pytest.mark.parametrize("lever_id,mode", [
    ("compile-blocks", "max-autotune-no-cudagraphs"),
    ("compile-model", "max-autotune-no-cudagraphs"),
])
def test_a_max_autotune_lever_quiets_the_reports_while_on_and_puts_them_back(lever_id, mode):
    before = _settings()
    assert before, "this torch has neither of inductor's autotuning report settings"
    assert any(value not in (0, False) for value in before.values())
    lever = load_all()[lever_id]
    model = _Blocks()
    undo = lever.patch(Target(model=model, options={"mode": mode, "backend": "eager"}))
    try:
        assert all(value in (0, False) for value in _settings().values())
        assert not _passes(f"Runtime error during autotuning:\nout of resource\n{DROPPED_CHOICE}.")
        assert _passes("Runtime error during autotuning: something else went wrong")
    finally:
        undo()
    assert _settings() == before
    assert _passes(f"{DROPPED_CHOICE}.")


def test_the_other_modes_change_nothing():
    before = _settings()
    filters = list(logging.getLogger(AUTOTUNE_LOGGER).filters)
    for mode in (None, "default", "reduce-overhead"):
        undo = quiet_autotuning(mode)
        assert _settings() == before
        assert logging.getLogger(AUTOTUNE_LOGGER).filters == filters
        undo()


def test_a_report_the_user_asked_for_is_left_on(monkeypatch):
    variable = AUTOTUNE_REPORTS["autotune_num_choices_displayed"][0]
    monkeypatch.setenv(variable, "5")
    monkeypatch.setattr(inductor_config, "autotune_num_choices_displayed", 5)
    undo = quiet_autotuning("max-autotune")
    try:
        assert inductor_config.autotune_num_choices_displayed == 5
    finally:
        undo()
    assert inductor_config.autotune_num_choices_displayed == 5
