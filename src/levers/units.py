"""Human-readable numbers: FLOPs, bytes, durations, rates and shares (reports, findings, plans).

Bytes use binary prefixes (KiB, MiB, GiB) as PyTorch's memory tools do; FLOPs and rates use
decimal prefixes (GFLOP, TFLOP), as hardware data sheets do.
"""

from __future__ import annotations

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
    """``1.23 s``, ``45.6 ms`` or ``789 µs``."""
    if abs(seconds) >= 1.0:
        return f"{_num(seconds)} s"
    if abs(seconds) >= 1e-3:
        return f"{_num(seconds * 1e3)} ms"
    return f"{_num(seconds * 1e6)} µs"


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
    """A fraction of a total as a percentage, ``12.3%``."""
    return f"{fraction * 100:.1f}%"
