"""bench/arch_commands.py: each command's outcome (ok, refused, crash, timeout) from its process,
its rows and summary; one real architecture end to end."""

from __future__ import annotations

import json
import sys

import pytest
from bench_module import bench_module

pytest.importorskip("transformers")

# stand-ins for a levers command: what each exits with and writes, by architecture name
STAND_INS = {
    "good": "import json, sys; json.dump({'peak_allocated_bytes': 7}, open(sys.argv[1], 'w'))",
    "refuses": "import sys; print('levers: error: lower batch_size', file=sys.stderr); sys.exit(2)",
    "crashes": "raise KeyError('inside levers')",
    "hangs": "import time; time.sleep(60)",
}


def test_each_commands_outcome_is_read_from_its_process(tmp_path, monkeypatch):
    bench = bench_module("arch_commands.py", "bench_arch_commands")
    monkeypatch.setattr(bench, "COMMANDS", ("memory",))
    monkeypatch.setattr(bench, "command_line",
                        lambda command, name, path, size="tiny": [
                            sys.executable, "-c", STAND_INS[name], str(path)])
    code = bench.main(["--only", "good,refuses,crashes,hangs", "--timeout-s", "10",
                       "--out", str(tmp_path)])
    assert code == 0
    rows = {r["arch"]: r for r in map(json.loads,
                                      (tmp_path / "results.jsonl").read_text().splitlines())}
    assert rows["good"]["outcome"] == "ok" and rows["good"]["peak_allocated_bytes"] == 7
    assert rows["refuses"]["outcome"] == "refused"
    assert "lower batch_size" in rows["refuses"]["error"]
    assert rows["crashes"]["outcome"] == "crash" and "KeyError" in rows["crashes"]["error"]
    assert rows["hangs"]["outcome"] == "timeout" and rows["hangs"]["rc"] is None
    summary = (tmp_path / "summary.md").read_text()
    assert "| memory | 1 | 1 | 1 | 1 |" in summary
    assert "`crashes` memory: " in summary.split("## crash")[1]


def test_a_resumed_command_keeps_the_other_commands_rows(tmp_path, monkeypatch):
    bench = bench_module("arch_commands.py", "bench_arch_commands")
    monkeypatch.setattr(bench, "command_line",
                        lambda command, name, path, size="tiny": [
                            sys.executable, "-c", STAND_INS[name], str(path)])
    out = ["--out", str(tmp_path), "--timeout-s", "10"]
    assert bench.main(["--only", "good", "--commands", "audit,memory", *out]) == 0
    assert bench.main(["--only", "good,refuses", "--commands", "tune", "--resume", *out]) == 0
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert sorted((r["arch"], r["command"]) for r in rows) == [
        ("good", "audit"), ("good", "memory"), ("good", "tune"), ("refuses", "tune")]
    # every command of both has a row now: a resume runs nothing
    assert bench.main(["--only", "good,refuses", "--commands", "tune", "--resume", *out]) == 0
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 4
    with pytest.raises(SystemExit):
        bench.main(["--only", "good", "--commands", "train", *out])


def test_a_real_architecture_runs_every_command(tmp_path):
    bench = bench_module("arch_commands.py", "bench_arch_commands")
    assert bench.main(["--only", "opt", "--out", str(tmp_path)]) == 0
    rows = {r["command"]: r for r in map(json.loads,
                                         (tmp_path / "results.jsonl").read_text().splitlines())}
    assert rows["audit"]["outcome"] == "ok", rows["audit"].get("error")
    assert rows["audit"]["codes"] and rows["audit"]["bound"]
    assert rows["memory"]["outcome"] == "ok", rows["memory"].get("error")
    assert rows["memory"]["peak_allocated_bytes"] > 0
    # on a CPU tune A/Bs what can pay here and names why it left the rest out: on opt's
    # unpadded batch the loss's rows all count, so loss-valid-rows (the lever a CPU search of
    # an HF causal LM tried until 8015bc5) has nothing to fix, and nothing is left to try
    tune = rows["tune"]
    assert tune["outcome"] == "ok", tune.get("error")
    assert tune["trials"] == 0 and tune["nothing_tried"].startswith("no lever can be tried")
    assert tune["left_out"]["loss-valid-rows"].startswith("does not apply: nothing for it to fix")
    assert tune["left_out"]["compile-model"].startswith("its speed-up exists only on a GPU")
