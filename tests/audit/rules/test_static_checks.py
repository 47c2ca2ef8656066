"""The static source checks: guard evaluation around a peak reset, and block call sites."""

from __future__ import annotations

import ast
import textwrap

import pytest

from levers.audit.block_calls import block_call_sites
from levers.audit.peak_metric_source import UNKNOWN, evaluate, reset_in_source


class Flags:
    def __init__(self, window):
        self.window = window


@pytest.mark.parametrize(
    "source, scope, expected",
    [
        ("torch.cuda.is_available()", None, True),
        ("not torch.cuda.is_available()", None, False),
        ("x.device.type == 'cuda'", None, True),
        ("x.device.type != 'cuda'", None, False),
        ("flags.window and torch.cuda.is_available()", {"flags": Flags(False)}, False),
        ("flags.window and torch.cuda.is_available()", {"flags": Flags(True)}, True),
        ("flags.window and torch.cuda.is_available()", None, UNKNOWN),
        ("flags.window or torch.cuda.is_available()", None, True),
        ("step % 10 == 0", {"step": 3}, UNKNOWN),
        ("enabled", {"enabled": 0}, False),
        ("flags.missing", {"flags": Flags(True)}, UNKNOWN),
    ],
)
def test_guard_evaluation(source, scope, expected):
    assert evaluate(ast.parse(source, mode="eval").body, scope) is expected


def test_reset_lines(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(
        textwrap.dedent("""\
        import torch

        def step(flags):
            if flags.window and torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            return torch.cuda.max_memory_allocated()

        def other():
            return torch.cuda.max_memory_allocated()
        """)
    )
    assert reset_in_source(str(path), 6) == 5  # unknown guard: counted
    assert (
        reset_in_source(str(path), 6, {(str(path), "step"): {"flags": Flags(False)}})
        is None
    )
    assert reset_in_source(str(path), 9) is None  # a different function resets nothing
    assert reset_in_source(str(tmp_path / "missing.py"), 1) is None


def test_block_call_sites(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(
        textwrap.dedent("""\
        class Net:
            def forward(self, x):
                for i, block in enumerate(self.blocks):
                    x = block(x)
                for layer, cache in zip(self.layers, caches):
                    x = layer.suffix(x, cache)
                for layer in self.layers[:-1]:
                    x, k = layer(
                        x,
                    )
                return x
        """)
    )
    blocks = block_call_sites([str(path)], "blocks")
    assert [(s.line, s.function, s.code) for s in blocks] == [
        (4, "forward", "x = block(x)")
    ]
    layers = block_call_sites([str(path)], "layers")
    assert [(s.line, s.code) for s in layers] == [(8, "x, k = layer(")]
