"""``levers audit -- python train.py``: an option that only a factory's audit can honour is refused
before the script runs, not dropped."""

from __future__ import annotations

import pytest

from levers.cli import main


@pytest.mark.parametrize("flags, what_to_do", [
    # --set was dropped with a script, the audit ending 0 as if the workload had been set
    pytest.param(["--set", "batch_size=8"], "levers audit -- python train.py --batch-size 8",
                 id="set"),
    pytest.param(["--set", "batch_size=8", "lr=0.1"], "a script takes its own arguments after --",
                 id="set-two"),
    # the wait of a factory's audit under torchrun; no rank of a script's audit waits for another
    pytest.param(["--dist-timeout", "60"], "Drop --dist-timeout, or audit a factory under torchrun",
                 id="dist-timeout"),
])
def test_an_option_a_script_cannot_honour_is_refused_before_it_runs(
    tmp_path, flags, what_to_do, capsys
):
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    assert main(["audit", *flags, "--", "python", str(script)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert flags[0] in err  # says which option it refuses
    assert what_to_do in err  # and what to do instead
    assert not ran.exists()  # refused before the script ran


def test_a_workload_beside_a_script_is_refused_before_it_runs(tmp_path, capsys):
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    assert main(["audit", "demo", "--", "python", str(script)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "both a workload (demo) and a script after --" in err
    assert not ran.exists()
