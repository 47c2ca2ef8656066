"""Human-readable numbers: FLOPs, bytes, durations, rates and shares (reports, findings, plans).

Sizes typed by a user (``--gpu 40GiB``, ``ac-budget:budget=20GiB``) are read by
:func:`parse_bytes` alone.

Bytes use binary prefixes (KiB, MiB, GiB) as PyTorch's memory tools do; FLOPs and rates use
decimal prefixes (GFLOP, TFLOP), as hardware data sheets do. One format per unit, each with three
significant figures: a duration picks s, ms, µs or ns (never ``0.000944 ms``), a share keeps two
significant figures below 1% (``0.0041%``, never ``0.0%`` beside ``0.00408%``), a parameter
count takes B, M or k (``1.24B``, ``132k``, never ``0.00B``).
"""

from __future__ import annotations

import re

_DECIMAL = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BINARY = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def format_flops(flops: float) -> str:
    """``1.23 GFLOP``; exact below a thousand."""
    return _decimal(flops, "FLOP")


def format_count(n: float, unit: str = "") -> str:
    """``20,480 tokens/s``: whole numbers with separators, three figures below 100."""
    text = f"{n:,.0f}" if abs(n) >= 100 else _num(n)
    return f"{text} {unit}".rstrip()


def _decimal(value: float, unit: str) -> str:
    for scale, prefix in _DECIMAL:
        if abs(value) >= scale:
            return f"{_num(value / scale)} {prefix}{unit}"
    if float(value).is_integer():
        return f"{int(value)} {unit}"
    return f"{_num(value)} {unit}"


def format_bytes(num_bytes: float) -> str:
    """``12.3 MiB``; exact bytes below a KiB."""
    for scale, suffix in _BINARY:
        if abs(num_bytes) >= scale:
            return f"{_num(num_bytes / scale)} {suffix}"
    return f"{int(num_bytes)} B"


def format_seconds(seconds: float) -> str:
    """``1.23 s``, ``45.6 ms``, ``789 µs`` or ``42.8 ns``."""
    if abs(seconds) >= 1.0:
        return f"{_num(seconds)} s"
    if abs(seconds) >= 1e-3:
        return f"{_num(seconds * 1e3)} ms"
    if abs(seconds) >= 1e-6 or seconds == 0:
        return f"{_num(seconds * 1e6)} µs"
    return f"{_num(seconds * 1e9)} ns"


def format_ms(ms: float | None) -> str:
    """A duration held in milliseconds, as :func:`format_seconds` writes it; ``?`` for None."""
    if ms is None:
        return "?"
    return format_seconds(ms / 1e3)


def format_parameters(n: float) -> str:
    """``1.24B``, ``12.6M``, ``132k``, ``640``: a parameter count as model cards write it."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= scale:
            return f"{_num(n / scale)}{suffix}"
    return f"{int(n)}"


def _num(x: float) -> str:
    """Three significant figures without scientific notation (``1.23``, ``12.3``, ``123``)."""
    if abs(x) < 10:
        return f"{x:.2f}"
    if abs(x) < 100:
        return f"{x:.1f}"
    return f"{x:.0f}"


def format_us(dur_us: float) -> str:
    return format_seconds(dur_us * 1e-6)


def format_share(fraction: float) -> str:
    """A fraction of a total as a percentage: ``12.3%``, ``1.5%``; below 1% two significant
    figures (``0.0041%``), so that a small share never reads as ``0.0%``; ``0%`` for none."""
    percent = fraction * 100
    if percent == 0:
        return "0%"
    if abs(percent) >= 1:
        return f"{percent:.1f}%"
    return f"{percent:.2g}%" if abs(percent) >= 1e-4 else f"{percent:.1e}%"


# every unit a size may carry, as written in messages; read in any case
BYTE_UNITS = {
    "B": 1,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
_UNIT_BY_LOWER = {unit.lower(): factor for unit, factor in BYTE_UNITS.items()}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(text: str, *, unit_required: bool = False) -> int:
    """A size in bytes from ``40GiB``, ``512 MiB``, ``80GB``, ``2e10`` (bytes) or ``1024B``; units
    in any case. ``unit_required``: a bare number is refused (where it could be read as
    something else, as ``--gpu 40``).

    Raises:
        ValueError: not a size; the message lists the units.
    """
    match = _SIZE.match(str(text))
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _UNIT_BY_LOWER) or (unit_required and not unit):
        raise ValueError(
            f"{text!r} is not a size; write a number and a unit, e.g. 40GiB, 512MiB or 80GB "
            f"(units: {', '.join(BYTE_UNITS)})"
        )
    return int(float(match.group(1)) * _UNIT_BY_LOWER[unit or "b"])
