"""levers.units: the number formats the summary prints."""

from __future__ import annotations

import pytest

from levers.units import (
    format_bytes,
    format_count,
    format_flops,
    format_seconds,
    format_share,
    parse_bytes,
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


# ---- sizes typed by a user: one parser (levers.units.parse_bytes) for every option -------------


@pytest.mark.parametrize(
    ("text", "num_bytes"),
    [
        ("40GiB", 40 << 30), ("40 gib", 40 << 30), ("1.5GiB", 3 << 29), ("512MiB", 512 << 20),
        ("80GB", 80 * 10**9), ("20mb", 20 * 10**6), ("4KiB", 4096), ("2e10", 2 * 10**10),
        ("1024", 1024), ("1024B", 1024), ("1TiB", 1 << 40),
    ],
)
def test_a_size_is_read_with_any_unit_in_any_case(text, num_bytes):
    assert parse_bytes(text) == num_bytes


def test_a_bad_size_names_the_units():
    with pytest.raises(ValueError, match=r"'4 parsecs' is not a size.*units: B, KiB, MiB, GiB"):
        parse_bytes("4 parsecs")
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes("40", unit_required=True)


def test_the_gpu_budget_and_the_ac_budget_read_sizes_alike():
    from levers.hardware import CONTEXT_BYTES, resolve_gpu
    from levers.levers.ac_budget import budget_bytes

    for text in ("40GiB", "40 GiB", "40gib", "512MiB", "80GB", "20MB"):
        assert resolve_gpu(text).total_bytes == parse_bytes(text) + CONTEXT_BYTES
        assert budget_bytes(text, None) == parse_bytes(text)
