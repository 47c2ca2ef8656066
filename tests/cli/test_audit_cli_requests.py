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


@pytest.mark.parametrize("verb", ["audit", "memory"])
@pytest.mark.parametrize("flags, what_to_do", [
    # a script's options given to a factory's workload were dropped, the verb ending 0
    pytest.param(["--keep-running"], "give the script after --", id="keep-running"),
    pytest.param(["--tokens-per-step", "512"], "set that in the factory", id="tokens-per-step"),
])
def test_a_scripts_option_given_to_a_factory_is_refused_before_it_runs(
    tmp_path, verb, flags, what_to_do, capsys
):
    factory = tmp_path / "factory.py"
    ran = tmp_path / "ran"
    factory.write_text(f"def make():\n    open({str(ran)!r}, 'w').write('ran')\n")
    assert main([verb, f"{factory}:make", *flags]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert flags[0] in err and what_to_do in err
    assert not ran.exists()  # refused before the factory was built
