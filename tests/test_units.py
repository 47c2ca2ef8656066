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


def test_one_percent_format_keeps_small_shares_readable():
    # the audit printed "MFU 0.00408%" in one place and "MFU 0.0%" in another
    assert format_share(0.0000408) == "0.0041%"
    assert format_share(0.0) == "0%"
    assert format_share(0.016) == "1.6%"
    assert format_share(0.004) == "0.4%"


def test_durations_below_a_microsecond_and_parameter_counts():
    from levers.units import format_ms, format_parameters

    assert format_ms(0.000944) == "944 ns"  # was printed "0.000944 ms"
    assert format_ms(4.28e-05) == "42.8 ns"
    assert format_ms(1.13) == "1.13 ms"
    assert format_ms(None) == "?"
    assert format_parameters(132032) == "132k"  # was printed "0.00B"
    assert format_parameters(1.24e9) == "1.24B"
    assert format_parameters(12.6e6) == "12.6M"
    assert format_parameters(640) == "640"
