"""``levers audit --trace FILE`` and ``--html FILE`` on the plain-loop fixture script.

The HTML page is loaded in headless chromium (Debian's ``chromium``; skipped visibly where it
is missing): its script must draw every plot and raise no error.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from levers.audit.render_trace import trace_events
from levers.capture.json_io import read_capture
from levers.capture.records import KernelRecord
from levers.cli import main
from tests.integrations.conftest import SCRIPTS, line_of

LOOP = SCRIPTS / "train_loop.py"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
NUM_PLOTS = 4


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    paths = {k: out / f"{k}" for k in ("trace.json", "page.html", "capture.json")}
    code = main(["audit", "--trace", str(paths["trace.json"]), "--html", str(paths["page.html"]),
                 "--json", str(paths["capture.json"]), "--", "python", str(LOOP), "--steps", "6"])
    assert code == 0
    return paths


def test_trace_holds_every_op_with_its_module_phase_line_and_shapes(audited):
    trace = json.loads(audited["trace.json"].read_text())
    capture = read_capture(audited["capture.json"])
    events = trace["traceEvents"]
    ops = [e for e in events if e.get("tid") == 3 and e["ph"] == "X"]
    assert [e["args"]["index"] for e in ops] == list(range(len(capture.ops)))
    starts = [e["ts"] for e in ops]
    assert starts == sorted(starts) and all(e["dur"] > 0 for e in ops)
    by_op = {e["args"]["index"]: e for e in ops}
    for op in capture.ops:
        args = by_op[op.index]["args"]
        assert (args["op"], args["phase"], args["module"]) == (op.name, op.phase, op.module)
        assert args["inputs"] == [f"[{', '.join(map(str, t.shape))}] {t.dtype}" for t in op.inputs]
    scores_line = line_of(LOOP, 'scores = torch.einsum("bqhd')
    bmm = [e for e in ops if e["args"]["source"] == f"{LOOP}:{scores_line}" and "bmm" in e["name"]]
    assert bmm and bmm[0]["args"]["module"] == "blocks.0.attn"
    assert bmm[0]["args"]["code"].startswith('scores = torch.einsum("bqhd')
    phases = [e["name"] for e in events if e.get("cat") == "phase"]
    assert phases == ["forward", "backward", "optimizer"]
    modules = {e["name"] for e in events if e.get("cat") == "module"}
    assert {"blocks.0.attn.qkv", "blocks.1.mlp.0", "head"} <= modules
    assert not [e for e in events if e.get("pid") == 2]  # no device track on a CPU capture


def test_trace_puts_gpu_kernels_on_their_own_track(audited):
    capture = read_capture(audited["capture.json"])
    mm = next(op for op in capture.ops if op.name == "aten.mm.default")
    kernels = (
        KernelRecord(name="sm90_gemm", device_us=12.5, op_index=mm.index, start_us=0.0),
        KernelRecord(name="elementwise", device_us=2.0, op_index=None, start_us=20.0),
    )
    trace = trace_events(dataclasses.replace(capture, kernels=kernels))
    device = [e for e in trace["traceEvents"] if e.get("pid") == 2 and e["ph"] == "X"]
    assert [(e["name"], e["dur"]) for e in device] == [("sm90_gemm", 12.5), ("elementwise", 2.0)]
    # the first joined kernel starts where its op starts; the next one 20 us of device time later
    assert device[0]["ts"] == pytest.approx(mm.start_us)
    assert device[1]["ts"] - device[0]["ts"] == pytest.approx(20.0)
    assert device[0]["args"] == {"op_index": mm.index, "op": mm.name, "module": mm.module,
                                 "phase": mm.phase}


def test_html_is_self_contained_and_holds_the_findings_at_their_lines(audited):
    page = audited["page.html"].read_text()
    assert not re.search(r"""<link|<img|\ssrc=|\shref=|@import|url\(""", page)
    assert page.count("http") == page.count("http://www.w3.org/2000/svg")  # the SVG namespace only
    for code in ("NORM001", "ATTN002", "MEM001", "SYNC001"):
        assert f"data-code='{code}'" in page
    assert f"train_loop.py:{line_of(LOOP, 'scores = torch.einsum')}" in page
    assert "scores = torch.einsum(&quot;bqhd,bkhd-&gt;bhqk&quot;, q, k)" in page


def _chromium(*args: str, user_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={user_dir}", "--enable-logging=stderr", "--v=0",
         *args],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")
def test_html_renders_its_plots_in_a_browser_without_errors(audited, tmp_path):
    result = _chromium("--dump-dom", audited["page.html"].as_uri(), user_dir=tmp_path / "profile")
    body = re.search(r"<body[^>]*>", result.stdout)
    assert body is not None, result.stderr[-2000:]
    assert f'data-rendered="{NUM_PLOTS}"' in body.group(0)
    assert 'data-errors=""' in body.group(0)
    assert "Uncaught" not in result.stderr
    assert not re.search(r"CONSOLE\(\d+\)\].*(Error|error)", result.stderr)
    # the plots are in the DOM: four SVGs, the peak marked on the timeline
    assert result.stdout.count("<svg") == NUM_PLOTS
    assert 'class="peak"' in result.stdout and "peak " in result.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (apt-get install -y chromium)")
def test_a_script_error_in_the_page_is_caught_and_shown(audited, tmp_path):
    broken = tmp_path / "broken.html"
    broken.write_text(audited["page.html"].read_text().replace(
        "n+=whatif('plot-whatif');", "n+=whatif('plot-whatif');undefinedFunction();"))
    result = _chromium("--dump-dom", broken.as_uri(), user_dir=tmp_path / "profile")
    body = re.search(r"<body[^>]*>", result.stdout).group(0)
    assert "undefinedFunction is not defined" in body
    assert 'data-rendered="0"' in body
