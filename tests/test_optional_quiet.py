"""torchao's import-time warnings stay off stderr where levers imports it, directly (the float8
and optimizer-state levers) or through transformers' modeling code (its quantizers import
torchao when the first model class loads): the built-in workloads and a lever's applies."""

from __future__ import annotations

import subprocess
import sys

from tests.optional_deps import needs

NOISE = ("Failed to load", "register_constant()")

BUILD = """
from levers.loader import load_workload
from levers.levers import load_all
workload = load_workload("zoo", {"model": "nanogpt", "size": "tiny"})
import levers.levers.float8 as float8
float8.LEVER.applies  # the lever's module, which imports torchao quietly when asked
from levers.optional import import_quietly
import_quietly("torchao.float8")
load_workload("hf", {"size": "tiny", "arch": "llama"})
print("built")
"""


@needs("torchao", "transformers")
def test_building_a_transformers_workload_prints_none_of_torchaos_import_warnings():
    result = subprocess.run([sys.executable, "-c", BUILD], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    assert "built" in result.stdout
    assert not [line for line in result.stderr.splitlines() if any(n in line for n in NOISE)]
