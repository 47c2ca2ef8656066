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


# A stand-in torchvision whose compiled operators did not load: its registrations fail as a
# torchvision built for another torch does, and a stand-in timm imports it.
FAKE_PACKAGES = {
    "torchvision/__init__.py": "from torchvision import _meta_registrations, _autograd_registrations\n"
                               "from torchvision import ops\n",
    "torchvision/_meta_registrations.py": "raise RuntimeError('operator torchvision::nms does not exist')\n",
    "torchvision/_autograd_registrations.py": "",
    "torchvision/ops.py": "def frozen():\n    return 'python side'\n",
    "timm/__init__.py": "import torchvision.ops\n__version__ = 'stand-in'\n",
}

IMPORT_TIMM = """
import sys
from levers.errors import MissingDependency
from levers.optional import import_timm
try:
    timm = import_timm()
except MissingDependency as exc:
    print("missing:", exc)
else:
    import torchvision.ops
    print("imported", timm.__version__, torchvision.ops.frozen(),
          vars(sys.modules["torchvision._meta_registrations"]).get("__file__"))
"""


def _import_timm_beside(tmp_path, env_value):
    import os

    for name, text in FAKE_PACKAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "LEVERS_TORCHVISION_WITHOUT_OPS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    if env_value is not None:
        env["LEVERS_TORCHVISION_WITHOUT_OPS"] = env_value
    result = subprocess.run([sys.executable, "-c", IMPORT_TIMM], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_a_torchvision_without_its_compiled_operators_gets_an_error_that_says_what_to_do(tmp_path):
    out = _import_timm_beside(tmp_path, None)
    assert out.startswith("missing: timm imports torchvision, whose compiled operators do not load")
    assert "operator torchvision::nms does not exist" in out
    assert "Install the torchvision built for this torch" in out
    assert "set LEVERS_TORCHVISION_WITHOUT_OPS=1" in out


def test_with_the_switch_timm_imports_without_torchvisions_operator_registrations(tmp_path):
    # the failing registrations are skipped (an empty module stands in: no __file__); the rest of
    # torchvision's Python imports as it is
    assert _import_timm_beside(tmp_path, "1").split() == ["imported", "stand-in", "python", "side",
                                                          "None"]
    assert _import_timm_beside(tmp_path, "0").startswith("missing: ")
