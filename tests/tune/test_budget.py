import pytest

from levers.tune.budget import format_duration, parse_duration_s


@pytest.mark.parametrize(
    "text,seconds",
    [("10m", 600.0), ("90s", 90.0), ("1h30m", 5400.0), ("600", 600.0), ("1.5m", 90.0),
     (" 2m 30s ", 150.0), (45, 45.0), ("500ms", 0.5)],
)
def test_durations_read(text, seconds):
    assert parse_duration_s(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten minutes", "10x", "0", "-5", "m10", "10m5"])
def test_bad_durations_say_what_reads(text):
    with pytest.raises(ValueError, match="write the budget as 10m"):
        parse_duration_s(text)


def test_durations_format_short():
    assert format_duration(252) == "4m12s"
    assert format_duration(38) == "38s"
    assert format_duration(3720) == "1h02m"
