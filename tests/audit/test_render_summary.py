"""levers.audit.render_summary: the printed step summary (sections and the exact figures)."""

from __future__ import annotations

import io
import os

from rich.console import Console

from levers.audit.render_summary import (
    describe_provenance,
    render_summary,
    short_path,
    shorten_code,
)

from hand_capture import make_capture, make_ops


def _render(capture, top_n=5) -> str:
    out = io.StringIO()
    render_summary(capture, Console(file=out, width=160, color_system=None), top_n=top_n)
    return out.getvalue()


def _line(text: str, start: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith(start)]
    assert lines, f"no line starting with {start!r}"
    return " ".join(lines[0].split())


def test_header_and_step_figures(capture):
    text = _render(capture)
    assert text.splitlines()[0] == "levers audit tiny (size='tiny', batch_size=4)"
    assert text.splitlines()[1] == "device cpu · torch 2.13.0 · python 3.11.7"
    assert (
        text.splitlines()[2]
        == "figures: measured: wall_time · counted: bytes, flops · tracked: memory"
    )
    assert _line(text, "ops ") == "ops 6 aten ops in one step"
    assert _line(text, "FLOPs") == "FLOPs 3.11 kFLOP counted"
    assert _line(text, "bytes moved ") == "bytes moved 694 B (read 450 B, written 244 B) counted"
    assert _line(text, "wall time / step") == (
        "wall time / step 25.0 ms median of 4 plain steps (min 10.0 ms, max 50.0 ms) measured"
    )
    assert _line(text, "captured step") == (
        "captured step 100 ms (4.0x a plain step: capture overhead) measured"
    )
    assert _line(text, "tokens / step") == "tokens / step 512"
    assert _line(text, "tokens / s ") == "tokens / s 20,480 tokens/s measured"
    assert _line(text, "peak memory") == (
        "peak memory 3.00 MiB (start 1.00 MiB, end 1.00 MiB; tracked-storages) tracked"
    )
    assert "device time" not in text  # a CPU capture has no device time


def test_phase_table(capture):
    text = _render(capture)
    assert _line(text, "forward") == "forward 4 1.01 kFLOP 274 B"
    assert _line(text, "backward") == "backward 1 2.00 kFLOP 300 B"
    assert _line(text, "optimizer") == "optimizer 1 100 FLOP 120 B"
    assert _line(text, "other") == "other 0 0 FLOP 0 B"
    assert _line(text, "total") == "total 6 3.11 kFLOP 694 B"


def test_top_tables(capture):
    text = _render(capture)
    for title in (
        "Top modules by FLOPs",
        "Top source lines by FLOPs",
        "Top modules by bytes moved",
        "Top source lines by bytes moved",
    ):
        assert title in text
    assert _line(text, "enc.fc") == "enc.fc 3.10 kFLOP 99.7% 3"
    assert _line(text, "<outside model>") == "<outside model> 10 FLOP 0.32% 1"
    assert _line(text, "/home/me/proj/model.py:10") == (
        "/home/me/proj/model.py:10 3.00 kFLOP 96.5% 2 y = x @ self.w"
    )
    assert "Top modules by device time" not in text


def test_top_n_limits_rows(capture):
    text = _render(capture, top_n=1)
    assert "<outside model>" not in text
    assert "Host-device sync sites (top 1 of 2)" in text


def test_device_time_sections_on_gpu(capture):
    text = _render(make_capture(ops=make_ops(device=True)))
    assert _line(text, "device time") == "device time 37.5 µs"
    assert "Top modules by device time" in text
    assert "Top source lines by device time" in text
    assert _line(text, "total") == "total 6 3.11 kFLOP 694 B 37.5 µs"


def test_calls_tables(capture):
    text = _render(capture)
    assert _line(text, "sync ") == "sync 4 at 2 source line(s), below"
    assert _line(text, "sdpa") == "sdpa 3 backend ran: math x2, flash x1"
    assert _line(text, "loss") == "loss 1"
    assert _line(text, "memory_metric") == "memory_metric 1"
    assert _line(text, "/home/me/proj/train.py:30") == (
        "/home/me/proj/train.py:30 3 Tensor.__int__, item n = int(mask.sum())"
    )
    assert _line(text, "/home/me/proj/train.py:31") == (
        "/home/me/proj/train.py:31 1 Tensor.__bool__ (1 from torch) if bad.any():"
    )


def test_no_calls(capture):
    text = _render(make_capture(calls=()))
    assert _line(text, "(none)") == "(none) 0"
    assert "Host-device sync sites" not in text


def test_describe_provenance_orders_kinds():
    assert (
        describe_provenance(
            {"memory": "tracked", "peak": "estimated", "flops": "counted", "time": "measured"}
        )
        == "measured: time · counted: flops · estimated: peak · tracked: memory"
    )


def test_short_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert short_path(f"{tmp_path}{os.sep}train.py:12") == "train.py:12"
    assert short_path("/elsewhere/train.py:12") == "/elsewhere/train.py:12"
    assert short_path("<unknown source>") == "<unknown source>"


def test_short_path_site_packages():
    label = "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py:80"
    assert short_path(label) == "transformers/models/llama/modeling_llama.py:80"


def test_long_code_is_shortened():
    assert shorten_code("x" * 44) == "x" * 44
    assert shorten_code("x" * 50) == "x" * 43 + "…"


def test_receipts_name_a_file_as_the_tables_do(tmp_path, monkeypatch):
    from levers.audit.report_format import relative_path

    monkeypatch.chdir(tmp_path)
    site = "/venv/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py"
    assert relative_path(site) == "transformers/models/llama/modeling_llama.py"
    for path in (site, f"{tmp_path}{os.sep}train.py", "/elsewhere/train.py", "train.py"):
        assert short_path(f"{path}:7") == f"{relative_path(path)}:7"
