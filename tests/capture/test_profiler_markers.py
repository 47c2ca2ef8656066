"""The profiler's own marker lines (Kineto's "USDT:... profiler_start") stay off stderr."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_a_capture_writes_no_profiler_marker_lines_and_keeps_the_rest(tmp_path):
    code = textwrap.dedent("""
        import os, sys
        import torch
        from levers.capture.gpu import timed_profiler
        os.write(2, b"before\\n")
        with timed_profiler(False):
            torch.ones(3).sum()
            os.write(2, b"inside\\n")
        os.write(2, b"after\\n")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.decode().splitlines()
    assert [line for line in lines if "SyncActivityProfilerHandler" in line] == []
    assert [line for line in lines if line in ("before", "inside", "after")] == [
        "before", "inside", "after",
    ]
