"""A step that fake tensors cannot run: one line on stderr, no torch log lines or tracebacks,
and when the fix is the workload's own, what to change instead of a request for a bug report."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from levers.cli import main
from levers.memory.fake_failures import torch_logs_captured

FACTORIES = Path(__file__).parents[1] / "fixtures" / "fake_unfriendly_factories.py"


def run(capfd, *argv: str) -> tuple[int, str, str]:
    # capfd, not capsys: a DataLoader's worker processes write to file descriptor 2 directly
    code = main(list(argv))
    out, err = capfd.readouterr()
    return code, out, err


def assert_no_torch_log(err: str) -> None:
    assert "Traceback" not in err
    assert "fake_tensor.py" not in err
    assert "failed while attempting to run meta" not in err


@pytest.mark.parametrize(
    ("factory", "fix"),
    [
        ("dataloader_with_workers", "build the DataLoader with num_workers=0"),
        (
            "custom_op_without_fake",
            "the custom op levers_fixture::scale_no_fake has no fake kernel",
        ),
    ],
)
def test_memory_says_what_to_change_in_one_line(capfd, monkeypatch, factory, fix):
    monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    code, out, err = run(capfd, "memory", f"{FACTORIES}:{factory}", "--no-whatifs")
    assert code == 2
    assert_no_torch_log(err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("levers: error: predicting ")
    assert fix in lines[0]
    assert "register_fake" in lines[0] or "num_workers=0" in lines[0]
    assert "report" not in lines[0]


def test_debug_shows_the_detail(capfd, monkeypatch):
    monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    code, out, err = run(
        capfd, "memory", f"{FACTORIES}:custom_op_without_fake", "--no-whatifs", "--debug"
    )
    assert code == 2
    assert err.startswith("levers: error: predicting ")
    assert "Traceback (most recent call last)" in err
    assert "no fake impl registered" in err


def test_audit_warns_in_one_line(capfd, monkeypatch):
    monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    code, out, err = run(capfd, "audit", f"{FACTORIES}:dataloader_with_workers")
    assert code == 0
    assert_no_torch_log(err)
    warnings = [line for line in err.splitlines() if line.startswith("warning: levers memory")]
    assert len(warnings) == 1, err
    assert "num_workers=0" in warnings[0]


def test_torch_log_records_are_held_and_handlers_restored(monkeypatch):
    monkeypatch.delenv("LEVERS_DEBUG", raising=False)
    torch_logger = logging.getLogger("torch")
    before = (list(torch_logger.handlers), torch_logger.propagate)
    with pytest.raises(RuntimeError) as caught:
        with torch_logs_captured() as captured:
            logging.getLogger("torch._subclasses.fake_tensor").error("meta kernel failed")
            raise RuntimeError("boom")
    assert captured.lines == ["ERROR torch._subclasses.fake_tensor: meta kernel failed"]
    assert caught.value.levers_torch_log_lines == captured.lines
    assert (list(torch_logger.handlers), torch_logger.propagate) == before
