"""The short table `fecomlite run` prints: the costliest APIs, with provenance on every figure."""

from __future__ import annotations

import math
from typing import Any

from rich.table import Table

from fecomlite.analysis import RunAnalysis
from fecomlite.report.units import scaled
from fecomlite.terminal import plain


def summary_table(analysis: RunAnalysis, top: int = 10) -> Table:
    """Top APIs by above-idle energy of the run's first energy domain (measured first)."""
    run = analysis.run
    table = Table(
        title=f"run {run['id']}: {plain(run['program'])} ({plain(run['level'])} level, "
        f"{len(analysis.repetitions)} repetitions, {_status(run)})",
        title_justify="left",
    )
    table.add_column("API", overflow="fold")
    table.add_column("calls", justify="right")
    table.add_column("time", justify="right")
    for domain in analysis.domains:
        table.add_column(
            f"{plain(domain['domain'])} above idle\n({plain(_provenance(domain))})", justify="right"
        )
    for row in analysis.apis[:top]:
        cells = [plain(row["api"]), str(row["calls"]), scaled(row["total_time_s"], "s")]
        for domain in analysis.domains:
            energy = row["energy"].get(domain["domain"], {})
            cells.append(_energy_cell(energy))
        table.add_row(*cells)
    hyperparams = run.get("hyperparams") or {}
    if hyperparams:
        table.caption = "hyperparameters: " + ", ".join(
            f"{plain(k)}={plain(v)}" for k, v in hyperparams.items()
        )
    return table


def _status(run: dict[str, Any]) -> str:
    """The run's status; an incomplete run says how many events it lost."""
    lost = run.get("lost_events")
    return f"{run['status']}: {lost} events lost" if lost else str(run["status"])


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
    if spread and math.isfinite(spread):
        text += f" ± {scaled(spread, 'J')}"
    if energy.get("below_resolution_share", 0) > 0.5:
        text += " *"  # mostly calls shorter than the sensor's update period
    return text
