"""The short table `fecomlite run` prints: the costliest APIs, with provenance on every figure."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from fecomlite.analysis import RunAnalysis
from fecomlite.report.units import scaled


def summary_table(analysis: RunAnalysis, top: int = 10) -> Table:
    """Top APIs by above-idle energy of the run's first energy domain (measured first)."""
    run = analysis.run
    table = Table(
        title=f"run {run['id']}: {run['program']} ({run['level']} level, "
        f"{len(analysis.repetitions)} repetitions, {run['status']})",
        title_justify="left",
    )
    table.add_column("API", overflow="fold")
    table.add_column("calls", justify="right")
    table.add_column("time", justify="right")
    for domain in analysis.domains:
        what = f"share of {domain['of']}" if domain.get("role") == "share" else "above idle"
        flag = ", unreliable: busy machine" if not domain.get("reliable", True) else ""
        table.add_column(f"{domain['domain']} {what}\n({_provenance(domain)}{flag})",
                         justify="right")
    for row in analysis.apis[:top]:
        cells = [row["api"], str(row["calls"]), scaled(row["total_time_s"], "s")]
        for domain in analysis.domains:
            energy = row["energy"].get(domain["domain"], {})
            cells.append(_energy_cell(energy))
        table.add_row(*cells)
    caption = []
    if (analysis.load or {}).get("busy"):
        caption.append(analysis.load["text"])
    hyperparams = run.get("hyperparams") or {}
    if hyperparams:
        caption.append("hyperparameters: " + ", ".join(f"{k}={v}" for k, v in hyperparams.items()))
    if caption:
        table.caption = "\n".join(caption)
    return table


def _provenance(domain: dict[str, Any]) -> str:
    if domain["provenance"] == "measured":
        return "measured"
    return f"estimated: {domain['model']}" if domain.get("model") else "estimated"


def _energy_cell(energy: dict[str, Any]) -> str:
    value = energy.get("above_idle_J", math.nan)
    if not math.isfinite(value):
        return "-"
    spread = energy.get("uncertainty_J")
    text = scaled(value, "J")
    if value < 0 and spread is not None and -value <= 2 * spread:
        text = "≈ 0"  # below idle only by noise, as in the report's tables
    if spread and math.isfinite(spread):
        text += f" ± {scaled(spread, 'J')}"
    if energy.get("below_resolution_share", 0) > 0.5:
        text += " *"  # mostly calls shorter than the sensor's update period
    return text
