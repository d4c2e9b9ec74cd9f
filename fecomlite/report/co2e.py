"""CO2e in the report: grams per run, per API and per site, from a grid carbon intensity.

Kept apart from the builder (one call from `build_report`): it adds `co2e_g` to every API and
site row (energy above idle attributed to its calls, every domain that adds up, all
repetitions), a `co2e` block to report.json (the run's grams: program start to end in each
repetition, idle included, and the intensity used), `co2e_g` and `co2e_label` columns to the
CSVs, and a column to the HTML tables. Every figure is labelled "estimated" with its intensity,
and carries the reliability of the energy it comes from: where a domain it adds is unreliable (a
busy machine's package or DRAM above idle), every CO2e figure is marked unreliable with that
domain's reasons, in report.json (`reliable`, `unreliable`), the CSVs (`co2e_reliable`) and the
HTML (the column's heading and the run's figure).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

from fecomlite.analysis.carbon import Intensity, from_settings
from fecomlite.analysis.run_analysis import ADDITIVE_DOMAINS, RunAnalysis
from fecomlite.report.tables import Column, Group


def _additive(domain: str) -> bool:
    return domain in ADDITIVE_DOMAINS or domain.startswith("gpu:")


def run_energy_J(a: RunAnalysis) -> float:
    """The machine's energy over every repetition (program start to end, idle included), in
    the domains that add up: what the run drew from the grid."""
    return sum(
        e["total_J"]
        for rep in a.per_rep
        for domain, e in rep["energy"].items()
        if _additive(domain) and math.isfinite(e.get("total_J", math.nan))
    )


def add_co2e(
    a: RunAnalysis, intensity: Intensity | None, columns: list[list[Column]]
) -> dict[str, Any] | None:
    """Annotate the analysis rows and append a CO2e column to each table's `columns`; returns
    the report's `co2e` block, or None when no intensity was given (then nothing changes)."""
    intensity = intensity or from_settings(a.run.get("settings") or {})
    if intensity is None:
        return None
    used = [d for d in a.domains if _additive(d["domain"])]
    unreliable = [f"{d['domain']}: {'; '.join(d.get('unreliable') or ['unreliable'])}"
                  for d in used if not d.get("reliable", True)]
    for row in (*a.apis, *a.sites):
        joules = (row.get("all_domains") or {}).get("above_idle_J")
        ok = isinstance(joules, (int, float)) and math.isfinite(joules)
        row["co2e_g"] = intensity.grams(joules) if ok else None
        row["co2e_reliable"] = not unreliable
    group = Group("CO2e" + (" (unreliable)" if unreliable else ""), "estimated",
                  sensor=", ".join(d["domain"] for d in used))
    title = intensity.label() + ("; unreliable: " + "; ".join(unreliable) if unreliable else "")
    column = Column("co2e_g", "g", "", ("co2e_g",), "co2e_g", group, title=title)
    for cols in columns:
        cols.append(column)
    energy = run_energy_J(a)
    return {
        **intensity.to_json(),
        "run_energy_J": energy,
        "run_co2e_g": intensity.grams(energy),
        "repetitions": len(a.per_rep),
        "run_covers": "every repetition, program start to end, idle included",
        "domains": [d["domain"] for d in used], "reliable": not unreliable,
        "unreliable": unreliable,
        "rows_cover": "energy above idle attributed to the calls, all repetitions",
    }


def csv_with_co2e(text: str, rows: list[dict[str, Any]], label: str) -> str:
    """A table's CSV with `co2e_g` and `co2e_label` columns (rows in the same order)."""
    lines = list(csv.reader(io.StringIO(text)))
    if not lines:
        return text
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([*lines[0], "co2e_g", "co2e_label", "co2e_reliable"])
    for line, row in zip(lines[1:], rows, strict=True):
        grams = row.get("co2e_g")
        writer.writerow([*line, "" if grams is None else grams, label,
                         row.get("co2e_reliable", True)])
    return out.getvalue()
