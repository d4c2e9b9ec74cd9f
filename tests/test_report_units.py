"""The report's number format: three significant digits, a unit prefix that fits."""

from __future__ import annotations

import math

import pytest

from fecomlite.analysis import units


@pytest.mark.parametrize(
    ("value", "unit", "text"),
    [
        (0.0123, "J", "12.3 mJ"),
        (1234.5, "J", "1.23 kJ"),
        (0.9996, "J", "1.00 J"),  # rounds up into the next prefix, never "1000 mJ"
        (0.9994, "J", "999 mJ"),
        (9.996, "J", "10.0 J"),  # three digits after rounding, not "10.00"
        (5532.0, "J", "5.53 kJ"),
        (124.0, "W", "124 W"),
        (0.06, "W", "60.0 mW"),
        (0.0016, "s", "1.60 ms"),
        (300.0, "s", "5.00 min"),
        (9000.0, "s", "2.50 h"),
        (1.5e9, "B", "1.50 GB"),
        (-2.5e6, "B", "-2.50 MB"),
        (0.0, "J", "0 J"),
        (9.09e-12, "J", "0 J"),
        (-7.11e-15, "J", "0 J"),  # rounding residue, never a raw float
    ],
)
def test_scaled(value: float, unit: str, text: str) -> None:
    assert units.scaled(value, unit) == text


def test_signed_and_missing() -> None:
    assert units.scaled(2.5e6, "B", signed=True) == "+2.50 MB"
    assert units.scaled(-2.5e6, "B", signed=True) == "-2.50 MB"
    assert units.scaled(None, "J") == "–"
    assert units.scaled(math.nan, "J") == "–"


def test_percent_and_watt_hours() -> None:
    assert units.percent(0.523) == "52.3 %"
    assert units.percent(1.0) == "100 %"
    assert units.percent(0.000123) == "0.0123 %"
    assert units.percent(None) == "–"
    assert units.watt_hours(3600.0) == "1.00 Wh"
    assert units.watt_hours(11_052.0) == "3.07 Wh"
    assert units.watt_hours(36.0) == "10.0 mWh"
    assert units.watt_hours(7.2e6) == "2.00 kWh"


def test_a_negative_figure_within_its_noise_reads_as_zero_not_negative_energy() -> None:
    assert units.with_noise(-7.09, 8.1) == "≈ 0 (noise ± 8.10 J)"  # no negative figure shown
    assert units.with_noise(-7.09, 8.1, short=True) == "≈ 0"
    assert units.with_noise(1.5, 1.0) == "1.50 J ± 1.00 J"
    assert units.with_noise(2.0, None) == "2.00 J"
    beyond = units.with_noise(-30.0, 1.0)
    assert beyond.startswith("below the idle baseline by 30.0 J") and "-" not in beyond
    assert units.with_noise(-30.0, 1.0, short=True) == "below idle"
    # a difference of sums that is only rounding (cpu-process has no idle noise) is zero
    assert units.with_noise(-7.1e-15, 0.0) == units.with_noise(-7.1e-15, None) == "≈ 0"
