"""The top-level package: ``levers.predict_memory`` and ``levers.MemoryPlan`` are the memory
model's, loaded on first use."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import levers
import levers.memory


def test_import_levers_does_not_load_the_memory_model():
    script = textwrap.dedent(
        """\
        import sys
        import levers
        assert "levers.memory" not in sys.modules, "import levers loaded levers.memory"
        from levers import MemoryPlan, predict_memory
        import levers.memory
        assert predict_memory is levers.memory.predict_memory
        assert MemoryPlan is levers.memory.MemoryPlan
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ok\n"


def test_the_memory_model_imported_first_then_levers():
    # levers.memory imports levers.workload, which imports this package: no cycle either way
    script = (
        "import levers.memory.predict, levers; print(levers.predict_memory.__module__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "levers.memory.predict\n"


def test_names_are_the_memory_models():
    assert levers.predict_memory is levers.memory.predict_memory
    assert levers.MemoryPlan is levers.memory.MemoryPlan
    assert {"predict_memory", "MemoryPlan", "Workload"} <= set(dir(levers))
    assert {"predict_memory", "MemoryPlan", "Workload"} <= set(levers.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'predict_memroy'"):
        levers.predict_memroy  # noqa: B018


def test_levers_predict_memory_returns_the_memory_models_plan():
    plan = levers.predict_memory("llama", gpu="h100-80gb", params={"batch_size": 1})
    again = levers.memory.predict_memory(
        "llama", gpu="h100-80gb", params={"batch_size": 1}
    )
    assert isinstance(plan, levers.MemoryPlan)
    assert plan.gpu.name == "h100-80gb"
    assert plan.params["batch_size"] == 1
    assert (plan.peak_allocated_bytes, plan.peak_reserved_bytes) == (
        again.peak_allocated_bytes,
        again.peak_reserved_bytes,
    )
    assert plan.by_category == again.by_category
