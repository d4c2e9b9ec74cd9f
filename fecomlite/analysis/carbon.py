"""Grams CO2e from joules: a grid carbon intensity given by the user or looked up by region.

    grams = joules / 3.6e6 (kWh) × PUE × intensity (gCO2e/kWh)

The intensity is the user's (`--carbon-intensity`, `carbon_intensity` in [tool.fecomlite]) or an
annual average for a country code (`--region FRA`) from the bundled, dated table
`fecomlite/data/grid_intensity.csv` (its header names the source and how to refresh it). Either
way the result is an estimate: the grid's mix at the hour a program ran differs from its annual
average, and every figure says so with the intensity it used.
"""

from __future__ import annotations

import csv
import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLE = Path(__file__).resolve().parents[1] / "data" / "grid_intensity.csv"
J_PER_KWH = 3.6e6
ENV_INTENSITY = "FECOMLITE_CARBON_INTENSITY"
ENV_REGION = "FECOMLITE_REGION"
ENV_PUE = "FECOMLITE_PUE"


@dataclass(frozen=True)
class Intensity:
    """A carbon intensity and where it came from."""

    g_per_kwh: float
    source: str  # "given" or the table row, e.g. "FRA France 2023 (Ember via OWID)"
    pue: float = 1.0
    region: str | None = None  # the table's code, when it came from there

    def grams(self, joules: float) -> float:
        """Grams CO2e of `joules` drawn by the machine (× PUE for the data centre around it)."""
        return joules / J_PER_KWH * self.pue * self.g_per_kwh

    def label(self) -> str:
        """How every CO2e figure is labelled: estimated, with the intensity used."""
        pue = f", PUE {self.pue:g}" if self.pue != 1.0 else ""
        return f"estimated at {self.g_per_kwh:g} gCO2e/kWh ({self.source}{pue})"

    def to_json(self) -> dict[str, Any]:
        return {
            "g_per_kwh": self.g_per_kwh,
            "source": self.source,
            "pue": self.pue,
            "region": self.region,
            "label": self.label(),
            "provenance": "estimated",
        }


class CarbonError(ValueError):
    """An unknown region code or an intensity or PUE that cannot be."""


@functools.cache
def table() -> dict[str, tuple[str, float, int]]:
    """Code → (name, gCO2e/kWh, year) from the bundled table."""
    with open(TABLE, encoding="utf-8", newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return {r["code"].upper(): (r["name"], float(r["g_per_kwh"]), int(r["year"])) for r in rows}


def for_region(code: str, pue: float = 1.0) -> Intensity:
    """The table's intensity for a country code (ISO 3166-1 alpha-3) or its English name."""
    rows = table()
    key = code.strip().upper()
    if key not in rows:
        key = next((k for k, (name, _, _) in rows.items() if name.upper() == key), "")
    if not key:
        raise CarbonError(
            f"no grid intensity for region {code!r} in {TABLE.name} "
            "(ISO 3166-1 alpha-3 codes, e.g. USA, DEU, FRA)"
        )
    name, value, year = rows[key]
    source = f"{key} {name} {year} annual average, Ember via OWID"
    return Intensity(value, source, _pue(pue), region=key)


def resolve(
    g_per_kwh: float | None,
    region: str | None,
    pue: float | None,
    fallback: Intensity | None = None,
) -> Intensity | None:
    """The intensity asked for: a number wins over a region; neither gives `fallback`."""
    if g_per_kwh is not None:
        if not g_per_kwh >= 0:
            raise CarbonError(f"carbon intensity must be ≥ 0 gCO2e/kWh, not {g_per_kwh!r}")
        return Intensity(float(g_per_kwh), "given", _pue(pue))
    if region:
        return for_region(region, 1.0 if pue is None else pue)
    if fallback is not None and pue is not None:
        return Intensity(fallback.g_per_kwh, fallback.source, _pue(pue), fallback.region)
    return fallback


def from_settings(settings: dict[str, Any]) -> Intensity | None:
    """The intensity a run's stored settings name (`carbon_intensity`, `region`, `pue`)."""
    return resolve(settings.get("carbon_intensity"), settings.get("region"), settings.get("pue"))


def from_environment(
    env: os._Environ[str] | dict[str, str] | None = None,
) -> Intensity | None:
    """The intensity `fecomlite run` hands the measured program, if it was given one (kept out
    of the program's view of the environment: `runtime.hidden_env`)."""
    if env is None:
        from fecomlite.runtime import hidden_env

        env = hidden_env.environment()
    value, region = env.get(ENV_INTENSITY), env.get(ENV_REGION)
    pue = float(env[ENV_PUE]) if env.get(ENV_PUE) else None
    return resolve(float(value) if value else None, region or None, pue)


def environment(intensity: Intensity | None) -> dict[str, str]:
    """What `from_environment` reads back, for the measured program's environment."""
    if intensity is None:
        return {}
    where = (
        {ENV_REGION: intensity.region}
        if intensity.region
        else {ENV_INTENSITY: repr(intensity.g_per_kwh)}
    )
    return {**where, ENV_PUE: repr(intensity.pue)}


def _pue(pue: float | None) -> float:
    value = 1.0 if pue is None else float(pue)
    if not value >= 1.0:
        raise CarbonError(f"PUE is at least 1 (the IT load itself), not {pue!r}")
    return value
