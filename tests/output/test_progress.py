"""levers.output.progress: the status line shown while a step is captured."""

from __future__ import annotations

from levers.output.progress import progress_status, status_text


def test_status_text():
    assert status_text("capturing demo-tiny", 1204, "backward") == (
        "capturing demo-tiny: backward, 1,204 ops so far"
    )


def test_disabled_progress_prints_nothing(capsys):
    with progress_status(enabled=False) as progress:
        progress.say("loading")
        progress.on_ops(10, "forward")
    assert capsys.readouterr() == ("", "")


def test_progress_follows_stderr_being_a_terminal(capsys):
    # under pytest's capture stderr is no terminal, so nothing is drawn
    with progress_status() as progress:
        progress.say("loading")
        progress.on_ops(10, "forward")
    assert capsys.readouterr() == ("", "")
