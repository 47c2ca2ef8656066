"""A fast start: the parser, ``levers list`` and ``levers rule`` do not import torch.

Importing torch takes seconds on a small CPU; ``levers --help`` and a usage error must answer
without it. These tests check which modules are loaded (behaviour), not how long it takes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def _torch_loaded_after(code: str) -> str:
    program = textwrap.dedent(code) + "\nimport sys\nprint('TORCH', 'torch' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=120
    )
    assert "TORCH" in done.stdout, done.stderr
    return done.stdout.rsplit("TORCH", 1)[1].strip()


def test_import_levers_does_not_import_torch():
    assert _torch_loaded_after("import levers") == "False"


def test_building_the_parser_does_not_import_torch():
    assert _torch_loaded_after("import levers.cli; levers.cli.build_parser()") == "False"


@pytest.mark.parametrize(
    "argv",
    [["list"], ["list", "--json"], ["rule", "ATTN001"], ["rule", "--all"], ["--help"],
     ["audit", "--bogus"]],
    ids=lambda argv: " ".join(argv),
)
def test_quick_verbs_do_not_import_torch(argv):
    code = f"""
    import contextlib, io, levers.cli
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            levers.cli.main({argv!r})
        except SystemExit:
            pass
    """
    assert _torch_loaded_after(code) == "False"


def test_lever_metadata_read_from_source_is_what_the_levers_register():
    from levers.levers import load_all
    from levers.levers.metadata import info_of, lever_infos

    # by id: the registry's order is the order the lever modules were first imported in, which
    # depends on what ran before in the process
    registered = {lever.id: info_of(lever) for lever in load_all().values()}
    read = lever_infos()
    assert {info.id: info for info in read} == registered
    assert len(read) == len(registered)  # no lever read twice


def test_memory_parser_default_steps_is_the_memory_models():
    from levers.cli import memory as cli
    from levers.memory.fake import DEFAULT_NUM_STEPS

    assert cli.DEFAULT_NUM_STEPS == DEFAULT_NUM_STEPS


def test_package_attributes_still_load_on_first_read():
    import levers
    import levers.ab
    import levers.audit
    import levers.capture
    import levers.memory

    assert levers.Workload.__name__ == "Workload"
    assert callable(levers.audit.audit) and callable(levers.capture.capture_step)
    assert callable(levers.memory.predict_memory) and callable(levers.ab.run_ab)
    with pytest.raises(AttributeError):
        levers.audit.no_such_name  # noqa: B018
