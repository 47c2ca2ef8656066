"""``levers audit -- python train.py``: the plain-loop fixture script, run unchanged."""

from __future__ import annotations

import json

import pytest

from levers.cli import main
from tests.integrations.conftest import SCRIPTS, line_of, receipts_by_code, run_levers

LOOP = SCRIPTS / "train_loop.py"


def test_audit_of_a_plain_loop_finds_its_habits_at_its_own_lines(tmp_path, capsys):
    findings = tmp_path / "findings.json"
    capture = tmp_path / "capture.json"
    code = main(["audit", "--findings-json", str(findings), "--json", str(capture),
                 "--", "python", str(LOOP), "--steps", "10"])
    out = capsys.readouterr().out
    assert code == 0
    # the script's own output, up to the captured step (warm-up 2: steps 0 and 1 print; the
    # recorded step is step 1's print, zero_grad, step 2's batch, forward, backward, optimizer;
    # the timed step after it runs step 2's print to step 3's optimizer)
    assert "training 132032 parameters on cpu" in out
    assert "step 0 loss" in out and "step 1 loss" in out and "step 2 loss" in out
    assert "step 3 loss" not in out
    assert "done" not in out.splitlines()  # levers stopped the script after the capture
    # no `levers ab train_loop.py` (it would import the script, run its training, then refuse
    # it: no factory); what works for a script instead
    assert "levers ab train_loop.py" not in out and f"levers ab {LOOP}" not in out
    assert 'with levers.apply(model, "' in out and "README.md, section Workloads" in out
    receipts = receipts_by_code(findings)
    assert receipts == {
        "NORM001": {("train_loop.py", line_of(LOOP, "variance = x.float().pow(2)"))},
        "ATTN002": {("train_loop.py", line_of(LOOP, 'scores = torch.einsum("bqhd'))},
        "MEM001": {("train_loop.py", line_of(LOOP, "x = block(x)"))},
        "SYNC001": {("train_loop.py", line_of(LOOP, "loss {loss.item()"))},
        # no ELEM001: the hand-rolled norm's kernels are NORM001's alone, and the residual adds
        # and GELU left are under its 15% of the step
    }
    data = json.loads(capture.read_text())
    phases = [op["phase"] for op in data["ops"]]
    # one whole step: it opens in zero_grad (set_to_none: no op) and the batch, ends in the optimizer
    assert phases[0] == "forward" and phases[-1] == "optimizer"
    assert {"forward", "backward", "optimizer"} <= set(phases)
    assert data["workload"] == "train_loop.py"
    assert data["workload_params"] == {"command": f"python {LOOP} --steps 10"}
    # the model found from the optimizer's parameters: the script's TinyLM
    assert data["modules"][""] == "TinyLM"


def test_keep_running_lets_the_script_finish_with_its_own_results(capsys):
    import runpy
    import sys

    argv = sys.argv
    sys.argv = [str(LOOP), "--steps", "5"]
    try:
        runpy.run_path(str(LOOP), run_name="__main__")
    finally:
        sys.argv = argv
    plain = capsys.readouterr().out
    code = main(["audit", "--keep-running", "--select", "SYNC", "--", "python", str(LOOP),
                 "--steps", "5"])
    out = capsys.readouterr().out
    assert code == 0
    # the audit is printed as soon as the step is captured, before the script goes on (a script
    # that ends with os._exit after the capture keeps it: defect N19)
    report_at = out.index("levers audit train_loop.py")
    goes_on_at = out.index("step 3 loss")
    assert report_at < goes_on_at
    # around it, every line the plain run printed, the same (the capture changes no result)
    assert out[:report_at] + out[goes_on_at:] == plain


def test_a_script_that_raises_before_the_capture_keeps_its_traceback_and_exit_code(capsys):
    code = main(["audit", "--", "python", str(LOOP), "--fail-at-step", "1"])
    captured = capsys.readouterr()
    assert code == 1
    assert "step 0 loss" in captured.out
    err = captured.err
    assert "Traceback (most recent call last):" in err
    assert "RuntimeError: data shard missing at step 1" in err
    assert "runpy" not in err and "levers/integrations" not in err  # the script's frames only
    assert err.strip().splitlines()[-1] == (
        f"levers: python {LOOP} --fail-at-step 1 exited with 1; levers saw 1 optimizer step; "
        "needed 3 (--warmup 2, then the step to capture)"
    )


def test_a_script_that_exits_keeps_its_exit_code(capsys):
    code = main(["audit", "--", "python", str(LOOP), "--no-such-option"])
    err = capsys.readouterr().err
    assert code == 2  # argparse's
    assert "unrecognized arguments: --no-such-option" in err
    assert "levers saw no optimizer step" in err


def test_a_script_with_too_few_steps_says_how_many_it_saw(capsys):
    code = main(["audit", "--warmup", "3", "--", "python", str(LOOP), "--steps", "2"])
    captured = capsys.readouterr()
    assert code == 2
    assert "done" in captured.out.splitlines()  # the script ran to its end
    assert "levers saw 2 optimizer steps; needed 4 (--warmup 3, then the step to capture)" in (
        captured.err
    )


@pytest.mark.parametrize(
    "argv, message",
    [
        (["python"], "no script after python"),
        (["python", "-c", "pass"], "cannot apply the python option '-c'"),
        (["python", "missing.py"], "no such script: missing.py"),
        (["bash", "train.sh"], "'bash' is not python or a .py file"),
        ([], "nothing after --"),
    ],
)
def test_a_command_levers_cannot_run_is_refused_before_anything_runs(argv, message, capsys):
    assert main(["audit", "--", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_workload_and_a_script_together_are_refused(capsys):
    assert main(["audit", "demo", "--", "python", str(LOOP)]) == 2
    assert "give one" in capsys.readouterr().err


def test_a_verb_without_script_support_refuses_one(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["ab", "demo", "--", "python", str(LOOP)])
    assert exc.value.code == 2
    assert "does not take a script after --" in capsys.readouterr().err


def test_module_form_runs_as_python_m_does(tmp_path):
    findings = tmp_path / "findings.json"
    result = run_levers("audit", "--select", "ATTN002", "--findings-json", str(findings),
                        "--", "python", "-m", "scripts.train_loop", "--steps", "4",
                        cwd=SCRIPTS.parent)
    assert result.returncode == 0, result.stderr
    assert "step 1 loss" in result.stdout
    assert receipts_by_code(findings) == {
        "ATTN002": {("train_loop.py", line_of(LOOP, 'scores = torch.einsum("bqhd'))}
    }


def test_memory_of_a_script_reports_the_captured_peak_and_what_it_cannot_predict(capsys):
    code = main(["memory", "--", "python", str(LOOP), "--steps", "6"])
    out = capsys.readouterr().out
    assert code == 0
    assert "levers memory train_loop.py: optimizer step 3 of the script, tracked tensor storages" in out
    assert "peak tracked     5.47 MiB" in out
    assert f"at {LOOP}:{line_of(LOOP, 'loss = F.cross_entropy')}" in out
    assert "levers memory cannot predict this script's peak on another GPU" in out


def test_memory_without_a_workload_or_script_says_what_to_give(capsys):
    assert main(["memory"]) == 2
    assert "needs a WORKLOAD" in capsys.readouterr().err


@pytest.mark.parametrize("num_steps, mode, reason", [
    (10, "two-pass", None),  # the step after the recorded one is timed
    (3, "one-pass", "the run ended after the recorded step: no step was left to time"),
])
def test_a_script_is_captured_in_two_passes_when_a_step_is_left_to_time(
    capsys, num_steps, mode, reason
):
    from levers.integrations.script import ScriptCommand, run_script

    command = ScriptCommand(target=str(LOOP), is_module=False, args=("--steps", str(num_steps)))
    run = run_script(command, warmup=2, timed=0)
    capsys.readouterr()
    assert run.capture is not None and run.exit_code == 0
    assert (run.capture.passes.mode, run.capture.passes.reason) == (mode, reason)
    if mode == "two-pass":
        assert run.capture.passes.coverage >= 0.9


@pytest.mark.parametrize("ending", ["os._exit(9)", "os.kill(os.getpid(), signal.SIGKILL)"])
def test_keep_running_keeps_the_report_of_a_script_that_ends_without_unwinding(tmp_path, ending):
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, torch\n"
        "model = torch.nn.Linear(8, 8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for step in range(8):\n"
        "    loss = model(torch.ones(4, 8)).pow(2).mean()\n"
        "    loss.backward(); opt.step(); opt.zero_grad()\n"
        "    if step == 5:  # after the captured step; no exit handler or buffer flush runs\n"
        f"        {ending}\n"
    )
    capture = tmp_path / "capture.json"
    result = run_levers("audit", "--keep-running", "--select", "SYNC", "--json", str(capture),
                        "--", "python", str(script), timeout=120)
    # the script's own ending stands (os._exit's code; killed by SIGKILL), and the report was
    # printed and written when the step was captured, before the script went on (defect N19)
    assert result.returncode == (9 if "_exit" in ending else -9), result.stderr
    assert f"levers audit train.py (command='python {script}')" in result.stdout
    assert "Already right" in result.stdout
    assert json.loads(capture.read_text())["workload"] == "train.py"


def test_the_report_under_keep_running_runs_outside_the_script_s_autocast_and_no_grad(tmp_path):
    import torch

    from levers.integrations.script import ScriptCommand, run_script

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "model = torch.nn.Linear(8, 8)\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(6):\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "        loss = model(torch.ones(4, 8)).float().pow(2).mean()\n"
        "        loss.backward()\n"
        "        with torch.no_grad():\n"
        "            opt.step()  # the report is made in its hook\n"
        "    opt.zero_grad()\n"
    )
    seen = []

    def report(capture, workload):
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_grad_enabled()))

    run = run_script(ScriptCommand(str(script), False, ()), keep_running=True, on_captured=report)
    assert run.exit_code == 0 and run.num_steps == 6  # it ran on to its end
    assert seen == [(False, True)]
