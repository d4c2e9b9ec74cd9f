"""Numbers as people read them: three significant digits and a unit that fits the magnitude.

The same rules are written once more in `static/charts.js` (`FecomCharts.fmt`), so a value reads
the same in a table cell and in a chart's hover box.
"""

from __future__ import annotations

import math

from fecomlite.analysis import noise_floor

# (unit, factor) from the smallest; a value takes the largest unit it is ≥ 1 of.
ENERGY_UNITS = (("µJ", 1e-6), ("mJ", 1e-3), ("J", 1.0), ("kJ", 1e3), ("MJ", 1e6))
POWER_UNITS = (("mW", 1e-3), ("W", 1.0), ("kW", 1e3))
TIME_UNITS = (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))
BYTE_UNITS = (("B", 1.0), ("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12))
UNITS = {"J": ENERGY_UNITS, "W": POWER_UNITS, "s": TIME_UNITS, "B": BYTE_UNITS}
WH_J = 3600.0


def sig3(value: float) -> str:
    """Three significant digits without exponent notation for everyday magnitudes."""
    rounded = float(f"{value:.3g}")  # round first: 9.996 → 10.0, not 10.00
    if rounded == 0:
        return "0"
    digits = max(0, 2 - int(math.floor(math.log10(abs(rounded)))))
    return f"{rounded:.{digits}f}"


def scaled(value: float | None, unit: str, *, signed: bool = False) -> str:
    """`value` (in the SI base `unit`: J, W, s or B) with a prefix, e.g. 0.0123 J → "12.3 mJ"."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    if unit == "s" and abs(value) >= 120:
        return _minutes(value)
    scale = UNITS[unit]
    magnitude = abs(value)
    sign = "+" if signed and value > 0 else ""
    if magnitude == 0:
        return f"0 {unit}"
    if magnitude < scale[0][1] * 1e-3:  # below anything measured (rounding residue): 0
        return f"0 {unit}"
    name, factor = scale[0]
    for candidate, f in scale:
        if magnitude >= f * 0.9995:  # 999.6 mJ rounds to 1.00 J, not "1000 mJ"
            name, factor = candidate, f
    return f"{sign}{sig3(value / factor)} {name}"


def _minutes(seconds: float) -> str:
    if abs(seconds) >= 7200:
        return f"{sig3(seconds / 3600)} h"
    return f"{sig3(seconds / 60)} min"


def percent(value: float | None) -> str:
    """A share (0..1) as a percentage with three significant digits at most."""
    if value is None or not math.isfinite(value):
        return "–"
    if value == 0:
        return "0 %"
    pct = value * 100
    if abs(pct) < 0.01:  # nothing a reader can use, and noise when negative
        return "≈ 0 %"
    return f"{sig3(pct) if abs(pct) < 100 else f'{pct:.0f}'} %"


def watt_hours(joules: float | None) -> str:
    """Energy in Wh, for totals people compare with a meter or a bill."""
    if joules is None or not math.isfinite(joules):
        return "–"
    wh = joules / WH_J
    if abs(wh) >= 1000:
        return f"{sig3(wh / 1000)} kWh"
    if abs(wh) < 1:
        return f"{sig3(wh * 1000)} mWh"
    return f"{sig3(wh)} Wh"


def with_noise(
    value: float | None, noise: float | None, unit: str = "J", *, short: bool = False
) -> str:
    """A figure that can fall below zero by noise (a tail, energy outside calls), never shown
    as negative energy: within its noise (NOISE_SIGMAS σ) it reads "≈ 0 (noise ± 8.1 J)"; below
    zero beyond its noise it says by how much it is below the idle baseline. short: "≈ 0" and
    "below idle", for table cells."""
    if value is None or not math.isfinite(value):
        return "–"
    has_noise = noise is not None and math.isfinite(noise) and noise > 0
    state = noise_floor.below_zero(value, noise if has_noise else 0.0)
    if state == noise_floor.WITHIN_NOISE:
        return "≈ 0" if short or not has_noise else f"≈ 0 (noise ± {scaled(noise, unit)})"
    if state == noise_floor.BEYOND_NOISE:
        return "below idle" if short else (
            f"below the idle baseline by {scaled(-value, unit)}"
            + (f" (noise ± {scaled(noise, unit)})" if has_noise else "")
            + ": the baseline was busier; not energy the program used")
    return scaled(value, unit) + (f" ± {scaled(noise, unit)}" if has_noise and not short else "")
