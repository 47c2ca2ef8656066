"""``levers audit -- python train.py`` on loops that a single captured step can misread: a sync
on some steps only, two optimizers, a step that raises."""

from __future__ import annotations

import textwrap
from pathlib import Path

from levers.cli import main

HEADER = """\
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
x, y = torch.randn(4, 8), torch.randn(4, 1)
"""


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(HEADER + textwrap.dedent(body))
    return path


def test_a_sync_on_every_second_step_is_not_claimed_absent_from_the_run(tmp_path, capsys):
    script = _script(tmp_path, """\
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(8):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if step % 2 == 0:  # the captured step (after 2 warm-up steps) is not one of these
                print("loss", loss.item())
    """)
    code = main(["audit", "--select", "SYNC001", "--", "python", str(script)])
    out = capsys.readouterr().out
    assert code == 0
    right = " ".join(out.split("Already right")[1].split())  # the console wraps lines
    assert "no host-device syncs in the captured step" in right
    assert "one step of the script was captured" in right and "check the loop" in right


def test_two_optimizers_capture_one_whole_iteration_and_say_so(tmp_path, capsys):
    import json

    script = _script(tmp_path, """\
        opt_a = torch.optim.SGD(model[0].parameters(), lr=0.1)
        opt_b = torch.optim.Adam(model[2].parameters(), lr=0.1)
        for step in range(8):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt_a.step()
            if step % 2 == 0:  # not in the captured iteration (after 2 warm-up steps)
                opt_b.step()
            opt_a.zero_grad()
            opt_b.zero_grad()
    """)
    capture = tmp_path / "capture.json"
    code = main(["audit", "--select", "SYNC001", "--json", str(capture), "--", "python", str(script)])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    said = (
        "one whole iteration of 2 optimizers: from SGD.step() to its next, with Adam.step() "
        "0 times (it steps on other iterations) inside it"
    )
    assert said in out
    data = json.loads(capture.read_text())
    assert data["workload_params"]["captured"] == said
    # the model covers both optimizers' parameters, not the half the first one trains
    assert data["modules"][""] == "Sequential" and "2" in data["modules"]


def test_a_step_that_raises_under_capture_shows_the_scripts_frames_not_levers(tmp_path, capsys):
    script = _script(tmp_path, """\
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(8):
            out = model(x)
            if step == 2:  # the captured step: torch.cat runs under levers' capture modes
                out = torch.cat([out, torch.randn(3, 2)])
            loss = torch.nn.functional.mse_loss(out, y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    """)
    code = main(["audit", "--", "python", str(script)])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback (most recent call last):" in err
    assert "out = torch.cat([out, torch.randn(3, 2)])" in err
    assert "RuntimeError: Sizes of tensors must match" in err
    import levers

    levers_dir = str(Path(levers.__file__).resolve().parent)
    frames = [line for line in err.splitlines() if line.lstrip().startswith('File "')]
    assert frames and not [line for line in frames if levers_dir in line], frames


def test_an_error_raised_by_levers_own_hook_keeps_its_frames(tmp_path, capsys, monkeypatch):
    from levers.integrations import steps

    # the step watcher's own code fails (None is not callable), inside the script's opt.step()
    monkeypatch.setattr(steps, "Workload", None)
    script = _script(tmp_path, """\
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(8):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
    """)
    code = main(["audit", "--", "python", str(script)])
    err = capsys.readouterr().err
    assert code != 0
    assert "TypeError: 'NoneType' object is not callable" in err
    assert "raised inside levers, not by the script" in err
    assert "integrations/steps.py" in err


def test_the_loss_of_the_captured_step_is_read_and_a_nan_one_is_warned_of(tmp_path, capsys):
    import json

    script = _script(tmp_path, """\
        import sys
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(6):
            loss = torch.nn.functional.mse_loss(model(x), y)
            if step >= int(sys.argv[1]):
                loss = loss * float("nan")
            loss.backward()
            opt.step()
            opt.zero_grad()
            print("loss", step, repr(loss.item()))
    """)
    finite = tmp_path / "finite.json"
    assert main(["audit", "--select", "SYNC001", "--json", str(finite), "--", "python",
                 str(script), "99"]) == 0
    out, err = capsys.readouterr()
    # the loss passed to backward() in the captured step (the script's step 2), read once
    printed = {line.split()[1]: float(line.split()[2]) for line in out.splitlines()
               if line.startswith("loss ")}
    assert json.loads(finite.read_text())["settings"]["loss"] == printed["2"]
    assert "warning" not in err
    # defect N8: a script whose loss is NaN was audited without a word; a factory's is warned of
    nan = tmp_path / "nan.json"
    assert main(["audit", "--select", "SYNC001", "--json", str(nan), "--", "python", str(script),
                 "0"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "warning: the step's loss is nan in the captured step" in err
    assert json.loads(nan.read_text())["settings"]["loss"] == "nan"  # strict JSON
