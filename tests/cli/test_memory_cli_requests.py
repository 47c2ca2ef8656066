"""``levers memory``: an explicit request that cannot be met is an error; Ctrl-C in --fit keeps
the finished prediction."""

from __future__ import annotations

import pytest

from levers.cli import main


@pytest.mark.parametrize("flags", [["--fit"], ["--gpu", "h100"], ["--fit", "batch_size", "--gpu", "a100"]])
def test_fit_or_gpu_with_a_script_is_refused_before_it_runs(tmp_path, flags, capsys):
    ran = tmp_path / "ran"
    script = tmp_path / "train.py"
    script.write_text(f"open({str(ran)!r}, 'w').write('ran')\n")
    assert main(["memory", *flags, "--", "python", str(script)]) == 2
    err = capsys.readouterr().err
    assert "factory" in err
    assert not ran.exists()  # refused before the script ran


def test_ctrl_c_in_the_fit_search_prints_the_finished_prediction(monkeypatch, capsys):
    import levers.cli.memory as memory_cli

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(memory_cli, "_fit", interrupted)
    code = main(["memory", "demo", "--fit", "--steps", "1", "--no-whatifs"])
    out, err = capsys.readouterr()
    assert code == 130
    assert "max_memory_allocated" in out or "allocated" in out
    assert "interrupted" in err and "prediction above" in err


def test_ctrl_c_in_the_fit_search_writes_the_finished_prediction_to_json(tmp_path, monkeypatch, capsys):
    import json

    import levers.cli.memory as memory_cli
    from levers.memory.plan import FitPoint

    def interrupted(console, step, args, margin, params, ids, tried):
        tried.append(FitPoint(value=8, peak_allocated_bytes=1, peak_reserved_bytes=2, fits=True))
        raise KeyboardInterrupt

    monkeypatch.setattr(memory_cli, "_fit", interrupted)
    out_json = tmp_path / "m.json"
    code = main(["memory", "demo", "--fit", "--steps", "1", "--no-whatifs", "--json", str(out_json)])
    err = capsys.readouterr().err
    assert code == 130
    data = json.loads(out_json.read_text())  # defect N25: the complete part is kept
    assert data["peak_allocated_bytes"] > 0 and data["workload"].startswith("demo")
    assert data["fit"] == {
        "param": "batch_size",
        "interrupted": True,
        "curve": [{"value": 8, "peak_allocated_bytes": 1, "peak_reserved_bytes": 2, "fits": True}],
    }
    assert f"wrote {out_json}" in " ".join(err.split())
    assert "holds it and the 1 value(s) tried" in " ".join(err.split())
