"""The floor's one reader of quantities, timestamps and durations."""

from __future__ import annotations

import pytest

from nodeagent_tiering.cluster import units


@pytest.mark.parametrize(
    ("value", "number"),
    [(8, 8.0), ("8", 8.0), ("500m", 0.5), ("2k", 2000.0), ("1Gi", 2.0**30), ("1.5", 1.5)],
)
def test_quantities(value, number):
    assert units.amount(value) == number


@pytest.mark.parametrize("value", ["eight", "", "1Zi", "nan", "inf"])
def test_what_is_not_a_quantity(value):
    with pytest.raises(ValueError, match="not a quantity"):
        units.amount(value)


@pytest.mark.parametrize(
    ("text", "epoch"),
    [
        ("2026-01-01T00:00:00Z", 1767225600.0),
        ("2026-01-01T00:00:00.250000Z", 1767225600.25),
        ("2026-01-01T01:00:00+01:00", 1767225600.0),
        ("2026-01-01T00:00:00.123456789Z", 1767225600.123456),  # Go reads any fraction too
        ("2026-01-01T00:00:00", None),  # no zone: would read as the reader's local time
        ("2026-01-01", None),
        ("not a time", None),
        (None, None),
        (1767225600, None),
    ],
)
def test_timestamps(text, epoch):
    assert units.parse_time(text) == epoch


@pytest.mark.parametrize(("value", "n"), [(2, 2), ("2", 2), ("2k", 2000), ("1e400", 0), ("0.5", 0)])
def test_device_counts_read_a_refused_value_as_none(value, n):
    assert units.count(value) == n


def test_micro_time_is_read_back_to_the_microsecond():
    assert units.parse_time(units.micro_time(1767225600.125)) == 1767225600.125


@pytest.mark.parametrize(
    ("text", "seconds"), [("30d", 2592000.0), ("12h", 43200.0), ("90m", 5400.0), ("45", 45.0)]
)
def test_durations(text, seconds):
    assert units.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "soon", "-1h", "0s", "infh"])
def test_what_is_not_a_duration(text):
    with pytest.raises(ValueError, match="duration"):
        units.parse_duration(text)
