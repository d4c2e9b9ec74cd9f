"""The short table `fecomlite run` prints: the costliest APIs, with provenance on every figure;
the same rows as CSV or JSON (`--format`), and what the table's marks mean."""

from __future__ import annotations

import csv
import io
import json
import math
from typing import Any

from rich.table import Table

from fecomlite.analysis import noise_floor
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.analysis.units import scaled
from fecomlite.terminal import plain


def summary_table(analysis: RunAnalysis, top: int = 10) -> Table:
    """Top APIs by above-idle energy of the run's first energy domain (measured first)."""
    run = analysis.run
    table = Table(
        title=f"run {run['id']}: {plain(run['program'])} ({plain(run['level'])} level, "
        f"{len(analysis.repetitions)} repetitions, {_status(run)}{_quick(analysis)})",
        title_justify="left",
    )
    reps = len(analysis.repetitions)
    table.add_column(f"API (totals over {reps} repetition{'s' if reps != 1 else ''})",
                     overflow="fold")
    table.add_column("calls", justify="right")
    table.add_column("time", justify="right")
    for domain in analysis.domains:
        what = f"share of {domain['of']}" if domain.get("role") == "share" else "above idle"
        flag = ", unreliable" if not domain.get("reliable", True) else ""
        if domain.get("load_distortion"):
            flag += f", load: up to +{domain['load_distortion']:.0%}"
        table.add_column(f"{plain(domain['domain'])} {what}\nself / inclusive\n"
                         f"({plain(_provenance(domain))}{flag})", justify="right")
    for row in analysis.apis[:top]:
        calls = str(row["calls"]) + (" ~" if row.get("bucketed_calls") else "")
        cells = [plain(row["api"]), calls, scaled(row["total_time_s"], "s")]
        for domain in analysis.domains:
            energy = row["energy"].get(domain["domain"], {})
            cells.append(_energy_cell(energy))
        table.add_row(*cells)
    caption = []
    if _quick(analysis):
        caption.append(analysis.mode["text"])
    if (analysis.load or {}).get("busy"):
        caption.append(analysis.load["text"])
    said = set(((analysis.load or {}).get("busy_domains") or {}).values())  # in the load text
    caption += [f"{plain(d['domain'])} unreliable: {plain(why)}" for d in analysis.domains
                for why in d.get("unreliable") or [] if why not in said]
    caption += [f"{plain(d['domain'])} distorted by {plain(d['load_effect'])}"
                for d in analysis.domains if d.get("load_effect")]
    # where each was read ("sources") is in the report; the terminal gets the values
    hyperparams = {k: v for k, v in (run.get("hyperparams") or {}).items() if k != "sources"}
    if hyperparams:
        shown = ", ".join(f"{plain(k)}={plain(v)}" for k, v in hyperparams.items())
        caption.append(f"hyperparameters: {shown}")
    if caption:
        table.caption = "\n".join(caption)
    return table


def _quick(analysis: RunAnalysis) -> str:
    """", quick run" for a quick run's rough figures (`analysis.run_mode`), else ""."""
    return ", quick run" if (analysis.mode or {}).get("mode") == "quick" else ""


def _status(run: dict[str, Any]) -> str:
    """The run's status; an incomplete run says how many events it lost."""
    lost = run.get("lost_events")
    return f"{run['status']}: {lost} events lost" if lost else str(run["status"])


def _provenance(domain: dict[str, Any]) -> str:
    if domain["provenance"] == "measured":
        return "measured"
    return f"estimated: {domain['model']}" if domain.get("model") else "estimated"


def _energy_cell(energy: dict[str, Any]) -> str:
    """Self / inclusive energy, the inclusive figure with its ± (one σ of the calls' sum)."""
    spread = energy.get("uncertainty_J")
    spread = spread if spread and math.isfinite(spread) else None
    below = energy.get("below_zero")
    own = _figure(_number(energy.get("self_J")), below, None)
    text = own + " / " + _figure(_number(energy.get("above_idle_J")), below, spread)
    if _below_resolution(energy):
        text += " *"
    return text


def _figure(value: float | None, below: str | None, spread: float | None) -> str:
    if value is None:  # not shown below the idle baseline (the caption says why)
        return "below idle" if below == noise_floor.BEYOND_NOISE else "-"
    if below and value == 0:  # zero within noise, as in the report's tables
        return "≈ 0" + (f" (noise ± {scaled(spread, 'J')})" if spread else "")
    return scaled(value, "J") + (f" ± {scaled(spread, 'J')}" if spread else "")


def _below_resolution(energy: dict[str, Any]) -> bool:
    """Mostly calls shorter than the sensor's update period (their share is apportioned)."""
    return energy.get("below_resolution_share", 0) > 0.5


def summary_notes(analysis: RunAnalysis, top: int = 10) -> list[str]:
    """What the marks in `summary_table` mean, for the marks it shows."""
    cells = [
        row["energy"].get(d["domain"], {}) for row in analysis.apis[:top] for d in analysis.domains
    ]
    notes = []
    if any(
        math.isfinite(c.get("uncertainty_J") or math.nan) and c.get("uncertainty_J") for c in cells
    ):
        notes.append(
            "± : one standard deviation of the energy attributed to the API's calls "
            "(the attribution's uncertainty)."
        )
    notes.append("self / inclusive: a call's own energy, and with the wrapped calls nested in it "
                 "(counted in their callers too: add self figures, never inclusive ones).")
    if any(_below_resolution(c) for c in cells):
        notes.append(
            "* : most of this energy comes from calls shorter than the sensor's update "
            "period; it is apportioned by time within each reading, not seen directly."
        )
    if any(_number(c.get("above_idle_J")) is None and not c.get("below_zero") for c in cells):
        notes.append("- : no reading of that sensor covered the API's calls.")
    bucketed = [r for r in analysis.apis[:top] if r.get("bucketed_calls")]
    if bucketed:
        notes.append(
            f"~ : some of the API's calls are past the detail window (--keep) and kept as "
            f"buckets of {scaled(bucketed[0]['bucket_s'], 's')}: their energy is spread evenly "
            "over each bucket; counts and times are exact.")
    if any(c.get("below_zero") for c in cells):
        notes.append("≈ 0: below the idle baseline by no more than the noise, i.e. zero; below "
                     "idle: below it by more, not shown (the domain is flagged unreliable).")
    return notes


def summary_rows(analysis: RunAnalysis) -> list[dict[str, Any]]:
    """Every API of the run, costliest first, one flat record each (units in the keys)."""
    rows = []
    for row in analysis.apis:
        record: dict[str, Any] = {
            "api": row["api"],
            "calls": row["calls"],
            "time_s": row["total_time_s"],
            "run_mode": (analysis.mode or {}).get("mode", ""),
        }
        if "bucketed_calls" in row:  # --keep: calls folded into buckets, and their width
            record["bucketed_calls"] = row["bucketed_calls"]
            record["bucket_s"] = row["bucket_s"]
        for domain in analysis.domains:
            energy = row["energy"].get(domain["domain"], {})
            name = domain["domain"]
            record[f"{name}_self_J"] = _number(energy.get("self_J"))
            record[f"{name}_inclusive_J"] = _number(energy.get("above_idle_J"))
            record[f"{name}_self_share"] = _number(energy.get("share"))
            record[f"{name}_uncertainty_J"] = _number(energy.get("uncertainty_J"))
            record[f"{name}_provenance"] = _provenance(domain)
            record[f"{name}_below_resolution"] = _below_resolution(energy)
            record[f"{name}_below_zero"] = energy.get("below_zero") or ""
        rows.append(record)
    return rows


def summary_csv(analysis: RunAnalysis) -> str:
    rows = summary_rows(analysis)
    out = io.StringIO()
    columns = list(rows[0]) if rows else ["api", "calls", "time_s"]
    writer = csv.DictWriter(out, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def summary_json(analysis: RunAnalysis) -> str:
    run = analysis.run
    return json.dumps(
        {
            "run": run["id"],
            "program": run["program"],
            "level": run["level"],
            "status": run["status"],
            "repetitions": len(analysis.repetitions),
            "mode": analysis.mode,
            "apis": summary_rows(analysis),
        },
        indent=1,
    )


def _number(value: Any) -> float | None:
    """JSON has no NaN: a missing figure is null (an empty CSV cell)."""
    return float(value) if value is not None and math.isfinite(value) else None
