"""`fecomlite attribute`: the run's attribution on measurements from outside fecomlite.

For people with their own meter (a wall-plug watt-meter log, an `nvidia-smi` or NVML trace) and
their own call timings. The files follow the format of tests/fixtures/h200-nvml/:

CALLS.csv   columns `t_start_ns`, `t_end_ns` (CLOCK_MONOTONIC ns, the samples' clock), optional
            `api` (what the call was: the per-API totals and intensities group by it) and
            `thread` (calls on one thread nest; on different threads they run side by side);
            any other column is copied to the output.
SAMPLES.csv a `t_ns` column and value columns whose names end in their unit: `energy_mJ`
            (`_uJ`, `_J`: a cumulative counter) or `power_instant_mW` (`_uW`, `_W`: power).

A malformed file is refused with its file, row (counting the header as row 1), column and what
was expected; a call that ends before it starts is refused the same way.

The output CSV has one row per call: its input columns, then duration_s, energy_J (above idle,
inclusive of nested calls), self_energy_J, energy_total_J (with its idle share), uncertainty_J
(1σ), below_resolution, covered, parent (row index of the enclosing call, −1) and depth.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fecomlite.terminal import plain

if TYPE_CHECKING:  # imported where used: `fecomlite attribute --help` does without numpy
    import numpy as np
    from rich.console import Console

    from fecomlite.analysis import attribution as at

OUTPUT_COLUMNS = ("duration_s", "energy_J", "self_energy_J", "energy_total_J", "uncertainty_J",
                  "below_resolution", "covered", "parent", "depth")


def _read_csv(path: Path, hint: str) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV; an unreadable file or a row of the wrong width is named."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            rows = list(reader)
            header = list(reader.fieldnames or [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise typer.BadParameter(f"{path}: cannot be read as CSV: {exc}", param_hint=hint) from None
    for number, row in enumerate(rows, 2):
        if None in row or None in row.values():
            raise typer.BadParameter(f"{path} row {number}: expected {len(header)} fields",
                                     param_hint=hint)
    return header, rows


def _number(path: Path, number: int, column: str, text: str, kind: type, hint: str) -> Any:
    """One cell as an integer (ns) or a finite number, else an error naming where."""
    try:
        value = kind(text)
        if kind is float and not math.isfinite(value):
            raise ValueError(text)
        return value
    except ValueError:
        expected = "an integer (ns)" if kind is int else "a finite number"
        raise typer.BadParameter(f"{path} row {number}, column {column!r}: expected {expected}, "
                                 f"got {text!r}", param_hint=hint) from None


def _read_calls(path: Path) -> tuple[list[str], list[dict[str, str]], np.ndarray, np.ndarray]:
    """The calls' header, rows and start/end stamps; a call ending before it starts is refused."""
    import numpy as np

    header, rows = _read_csv(path, "--calls")
    missing = {"t_start_ns", "t_end_ns"} - set(header)
    if missing:
        raise typer.BadParameter(f"{path} lacks column(s) {', '.join(sorted(missing))}",
                                 param_hint="--calls")
    t0 = [_number(path, i, "t_start_ns", r["t_start_ns"], int, "--calls")
          for i, r in enumerate(rows, 2)]
    t1 = [_number(path, i, "t_end_ns", r["t_end_ns"], int, "--calls")
          for i, r in enumerate(rows, 2)]
    for i, (start, end) in enumerate(zip(t0, t1, strict=True), 2):
        if end < start or not 0 <= start < 2**63 or end >= 2**63:
            raise typer.BadParameter(f"{path} row {i}: expected 0 <= t_start_ns <= t_end_ns "
                                     f"< 2**63, got {start}..{end}", param_hint="--calls")
    return header, rows, np.array(t0, dtype=np.int64), np.array(t1, dtype=np.int64)


def _check_samples(path: Path, column: str) -> None:
    """Every sample's time an integer and its value a finite number, else where it is not."""
    header, rows = _read_csv(path, "--samples")
    if "t_ns" not in header:
        raise typer.BadParameter(f"{path} lacks the column t_ns", param_hint="--samples")
    for number, row in enumerate(rows, 2):
        _number(path, number, "t_ns", row["t_ns"], int, "--samples")
        _number(path, number, column, row[column], float, "--samples")


def _pick_column(path: Path, kind: str | None, column: str | None) -> str:
    """The value column: as given, else the first counter (J) or power (W) column, preferring an
    instant-power column over a moving average."""
    from fecomlite.sensors.replay import unit_of

    header, _ = _read_csv(path, "--samples")
    if column:
        if column not in header:
            raise typer.BadParameter(f"{path} has no column {column!r}", param_hint="--column")
        return column
    units = {}
    for name in header:
        if name == "t_ns":
            continue
        try:
            units[name] = unit_of(name)[0]
        except ValueError:
            continue
    wanted = {"counter": ("J",), "power": ("W",)}.get(kind or "", ("J", "W"))
    candidates = [c for c in units if units[c] in wanted]
    candidates.sort(key=lambda c: (wanted.index(units[c]), "avg" in c, "instant" not in c))
    if not candidates:
        raise typer.BadParameter(f"{path}: no energy (…_J) or power (…_W) column",
                                 param_hint="--samples")
    return candidates[0]


def attribute_command(
    calls: Annotated[Path, typer.Option(
        "--calls", exists=True, dir_okay=False, help="CSV of calls: t_start_ns, t_end_ns[, api, "
        "thread, ...]")],
    samples: Annotated[Path, typer.Option(
        "--samples", exists=True, dir_okay=False, help="CSV of samples: t_ns and a value column "
        "named with its unit (energy_mJ, power_instant_mW, ...)")],
    kind: Annotated[str | None, typer.Option(
        "--kind", help="counter (cumulative J) or power (W); default: from the column's unit")]
    = None,
    column: Annotated[str | None, typer.Option(
        "--column", help="value column of SAMPLES; default: the first energy column, else the "
        "first instant-power column")] = None,
    idle: Annotated[float | None, typer.Option(
        "--idle", help="idle power in W; default: the median power of quiet intervals")] = None,
    method: Annotated[str, typer.Option(
        "--method", help="overlap, intensity, or auto (intensity where the data tell APIs "
        "apart)")] = "auto",
    semantics: Annotated[str, typer.Option(
        "--semantics", help="power only: window (each value is the mean since the previous "
        "update, as NVML's) or linear (instantaneous readings)")] = "window",
    out: Annotated[Path | None, typer.Option(
        "-o", "--out", help="write one row per call to this CSV")] = None,
) -> None:
    """Attribute the energy of your own meter's trace to your own call timings.

    CALLS.csv: t_start_ns, t_end_ns (CLOCK_MONOTONIC ns, the samples' clock), optional api and
    thread; other columns are copied to the output. SAMPLES.csv: t_ns and value columns named
    with their unit: energy_mJ / _uJ / _J (a cumulative counter) or power_instant_mW / _W.
    Output (-o): per call, energy above idle (inclusive and self), with its idle share, a 1σ
    uncertainty, below-resolution and coverage flags, and the nesting.
    """
    import numpy as np
    from rich.console import Console

    from fecomlite.analysis import attribution as at
    from fecomlite.sensors.replay import load_trace

    if kind not in (None, "counter", "power"):
        raise typer.BadParameter("must be counter or power", param_hint="--kind")
    if method not in at.METHODS:
        raise typer.BadParameter(f"must be one of {', '.join(at.METHODS)}", param_hint="--method")
    if idle is not None and not 0 <= idle < float("inf"):
        raise typer.BadParameter(f"must be a finite power ≥ 0 W, not {idle}", param_hint="--idle")
    if semantics not in at.SEMANTICS:
        raise typer.BadParameter(f"must be one of {', '.join(at.SEMANTICS)}",
                                 param_hint="--semantics")
    header, rows, t0, t1 = _read_calls(calls)
    name = _pick_column(samples, kind, column)
    _check_samples(samples, name)
    trace = load_trace(samples, name)
    kind = kind or trace.kind
    if kind not in ("counter", "power"):
        raise typer.BadParameter(f"column {name!r} is neither energy nor power",
                                 param_hint="--column")
    try:
        iv = at.sensor_intervals(kind, trace.t_ns, trace.values, semantics=semantics)
    except ValueError as exc:  # e.g. a counter that decreases
        raise typer.BadParameter(f"{samples}: {exc}", param_hint="--samples") from None
    if iv.count == 0:
        raise typer.BadParameter(f"{samples}: column {name!r} changes too rarely to attribute",
                                 param_hint="--samples")
    api_names, group = np.unique([r.get("api") or "" for r in rows], return_inverse=True)
    thread = np.unique([r.get("thread") or "" for r in rows], return_inverse=True)[1]
    idle_source = "given"
    if idle is None:
        idle, idle_source = at.estimate_idle_W(iv, t0, t1), "estimated from quiet intervals"
    res = at.attribute(iv, t0, t1, idle_W=idle, thread=thread, group=group, method=method,
                       ngroups=max(len(api_names), 1))
    duration = (t1 - t0) / at.NS
    if out is not None:
        try:
            _write(out, header, rows, res, duration)
        except OSError as exc:
            raise typer.BadParameter(f"cannot write {exc.filename or out}: "
                                     f"{exc.strerror or exc}", param_hint="--out") from None
    _print(Console(), name, kind, iv, idle, idle_source, res, list(api_names), group, duration,
           out)


def _write(out: Path, header: list[str], rows: list[dict[str, str]], res: at.Attribution,
           duration: np.ndarray) -> None:
    values: dict[str, Any] = {
        "duration_s": duration, "energy_J": res.energy_J, "self_energy_J": res.self_energy_J,
        "energy_total_J": res.energy_total_J, "uncertainty_J": res.uncertainty_J,
        "below_resolution": res.below_resolution.astype(int),
        "covered": res.covered.astype(int), "parent": res.parent, "depth": res.depth,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*header, *OUTPUT_COLUMNS])
        for i, row in enumerate(rows):
            writer.writerow([*(row[h] for h in header),
                             *(_fmt(values[c][i]) for c in OUTPUT_COLUMNS)])


def _fmt(x: Any) -> Any:
    import numpy as np

    if isinstance(x, (float, np.floating)):
        return f"{x:.6g}" if math.isfinite(x) else ""
    return int(x)


def _print(
    console: Console, column: str, kind: str, iv: at.SensorIntervals, idle: float,
    idle_source: str, res: at.Attribution, api_names: list[str], group: np.ndarray,
    duration: np.ndarray, out: Path | None,
) -> None:
    from rich.table import Table

    from fecomlite.analysis import attribution as at

    console.print(
        f"[bold]{plain(column)}[/] ({kind}): {iv.count} intervals, update period "
        f"{iv.period_s * 1e3:.1f} ms; idle {idle:.2f} W ({idle_source}); "
        f"method [bold]{res.method}[/]"
        + (" (fell back: intensities not supported by the data)" if res.fell_back else "")
    )
    if res.fit is not None:
        console.print(f"  intensity fit: {plain(res.fit.reason)}")
    summary = Table("energy", "J", title="Totals (the sensor's own, over its intervals)")
    for label, value in (("total", res.total_J), ("idle", res.idle_J),
                         ("above idle", res.above_idle_J), ("  in calls", res.in_calls_J),
                         ("  outside calls", res.outside_calls_J), ("    of which tail",
                                                                     res.tail_J),
                         ("calls incl. idle share", res.in_calls_total_J)):
        summary.add_row(label, f"{value:.2f}")
    check = res.in_calls_total_J + (res.total_J - res.in_calls_total_J)
    summary.caption = (f"in calls + outside = {check:.2f} J of {res.total_J:.2f} J; "
                       f"{int(res.below_resolution.sum())} of {res.energy_J.size} calls below "
                       "resolution")
    console.print(summary)
    per_api = Table("api", "calls", "time s", "above idle J", "± J (1σ)", "intensity W",
                    title="Per API (inclusive of nested calls)")
    for g, name in enumerate(api_names):
        mine = group == g
        unc = at.group_uncertainty(res, mine, g)
        fit = res.fit
        intensity = (f"{fit.intensity_W[g]:.1f} ± {fit.sigma_W[g]:.1f}"
                     if fit is not None and math.isfinite(fit.sigma_W[g]) else "")
        per_api.add_row(plain(name) if name else "(none)", str(int(mine.sum())),
                        f"{duration[mine].sum():.3f}", f"{res.energy_J[mine].sum():.2f}",
                        f"{unc:.2f}", intensity)
    console.print(per_api)
    if out is not None:
        console.print(f"per-call rows written to {plain(out)}")
