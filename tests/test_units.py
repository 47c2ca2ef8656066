"""levers.units: the number formats the summary prints."""

from __future__ import annotations

import pytest

from levers.units import (
    format_bytes,
    format_count,
    format_flops,
    format_seconds,
    format_share,
)


@pytest.mark.parametrize(
    "flops, text",
    [
        (0, "0 FLOP"),
        (999, "999 FLOP"),
        (1500, "1.50 kFLOP"),
        (2.5e9, "2.50 GFLOP"),
        (123.4e12, "123 TFLOP"),
    ],
)
def test_format_flops(flops, text):
    assert format_flops(flops) == text


@pytest.mark.parametrize(
    "num_bytes, text",
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (3 << 20, "3.00 MiB"),
        (int(41.5 * 2**30), "41.5 GiB"),
    ],
)
def test_format_bytes(num_bytes, text):
    assert format_bytes(num_bytes) == text


@pytest.mark.parametrize(
    "seconds, text", [(2.0, "2.00 s"), (0.0256, "25.6 ms"), (0.000789, "789 µs"), (0, "0.00 µs")]
)
def test_format_seconds(seconds, text):
    assert format_seconds(seconds) == text


def test_format_count_and_share():
    assert format_count(20480.4, "tokens/s") == "20,480 tokens/s"
    assert format_count(12.345) == "12.3"
    assert format_share(0.1234) == "12.3%"
