"""The measured process's memory over the program's time, for every kind of run.

A `watch` run has no calls, so the per-API memory columns are empty: its memory is the process
tree's RSS timeline and its peak. Every memory gauge of the run (the tree's RSS, the root's
VmHWM, GPU memory) is read over the repetitions (baseline and tail left out): the first reading,
the peak and the peak per repetition, and a timeline small enough for a page (the peak per bin,
so no spike is lost), written to report.json, memory.csv and the HTML.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import numpy as np

from fecomlite.analysis import units
from fecomlite.report.palette import SERIES_COLORS
from fecomlite.report.timeline import GaugePeaks
from fecomlite.store import Store

MAX_POINTS = 500  # per sensor's timeline
WHAT = {"proc:rss": "RSS of the process tree (sampled)",
        "proc:peak_rss": "high-water mark of the root process (kernel's VmHWM)"}


def _what(sensor: dict[str, Any]) -> str:
    return WHAT.get(sensor["name"]) or sensor.get("description") or sensor["domain"]


def _windows(run: dict[str, Any], reps: list[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """(rep, start, end) of each repetition that started; an unfinished one ends with the run."""
    out = []
    for r in reps:
        start, end = r.get("t_start_ns"), r.get("t_end_ns") or run.get("t_end_ns")
        if start is not None and end is not None and end > start:
            out.append((int(r["rep"]), int(start), int(end)))
    return out


def process_memory(store: Store, run: dict[str, Any],
                   reps: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Each memory gauge's first reading, peak (over all and per repetition) and timeline over
    the repetitions; `peak_B` the largest peak of the RSS gauges. None without readings."""
    windows = _windows(run, reps)
    if not windows:
        return None
    origin = int(windows[0][1] if run.get("t_start_ns") is None else run["t_start_ns"])
    gauges = [s for s in store.sensors(run["id"]) if s["unit"] == "B" and s["kind"] == "gauge"]
    rows = [row for s in gauges if (row := _sensor_memory(store, s, windows, origin))]
    if not rows:
        return None
    rss = [r["peak_B"] for r in rows if r["domain"] == "process-memory"]
    return {"window": "repetitions", "sensors": rows, "peak_B": max(rss) if rss else None}


def _sensor_memory(store: Store, sensor: dict[str, Any], windows: list[tuple[int, int, int]],
                   origin: int) -> dict[str, Any] | None:
    """One gauge's figures over the repetitions, read chunk by chunk (a day of 200 Hz RSS is
    17 M samples): readings of 0 (a process that has exited) left out."""
    spans = [s for _, start, end in windows
             if (s := store.sample_span(sensor["id"], start, end, positive=True))]
    if not spans:
        return None
    first, last = min(a for a, _ in spans), max(b for _, b in spans)
    timeline = GaugePeaks(np.linspace(first, last + 1, MAX_POINTS + 1).astype(np.int64),
                          MAX_POINTS)
    reps: dict[int, dict[str, Any]] = {}
    for chunk in store.sample_chunks(sensor["id"], first):
        t, v = chunk["t"], chunk["v"]
        if t[0] > last:
            break
        t, v = t[v > 0], v[v > 0]
        inside = np.zeros(t.size, bool)
        for rep, start, end in windows:
            mask = (t >= start) & (t <= end)
            if mask.any():
                inside |= mask
                seen = reps.setdefault(rep, {"rep": rep, "first_B": float(v[mask][0]),
                                             "peak_B": -np.inf})
                seen["peak_B"] = max(seen["peak_B"], float(v[mask].max()))
        timeline.add(t[inside], v[inside])
    per_rep = [reps[rep] for rep, _, _ in windows if rep in reps]
    t, v = timeline.result()
    peak = max(r["peak_B"] for r in per_rep)
    return {"sensor": sensor["name"], "domain": sensor["domain"], "what": _what(sensor),
            "provenance": sensor["provenance"], "first_B": per_rep[0]["first_B"],
            "peak_B": peak, "growth_B": peak - per_rep[0]["first_B"], "per_rep": per_rep,
            "timeline": {"t_s": ((t - origin) / 1e9).round(4).tolist(), "B": v.tolist(),
                         "rep_starts": _rep_starts(t, windows)}}


def _rep_starts(t: np.ndarray, windows: list[tuple[int, int, int]]) -> list[int]:
    """The indices of the timeline's points that come after another repetition's end: between
    two repetitions no process of the program existed (gate, baseline), so a chart's line
    stops there. (By ends: a bin's point is stamped with the bin's start, which may come a
    little before the start of the repetition its readings belong to.)"""
    if t.size < 2:
        return []
    ends = np.array([end for _, _, end in windows], np.int64)
    ended = np.searchsorted(ends, t, "left")  # repetitions ended before each point
    return (np.flatnonzero(np.diff(ended)) + 1).tolist()


def memory_context(memory: dict[str, Any] | None) -> dict[str, Any] | None:
    """The HTML's rows (figures written with their units) and its chart."""
    if not memory:
        return None
    rows = [{"sensor": m["sensor"], "what": m["what"], "provenance": m["provenance"],
             "first": units.scaled(m["first_B"], "B"), "peak": units.scaled(m["peak_B"], "B"),
             "growth": units.scaled(m["growth_B"], "B", signed=True),
             "per_rep": ", ".join(units.scaled(r["peak_B"], "B") for r in m["per_rep"])}
            for m in memory["sensors"]]
    series = [{"label": f"{m['sensor']} ({m['provenance']})", "markers": False,
               "color": SERIES_COLORS[(4 + k) % len(SERIES_COLORS)],
               "points": _broken_points(m["timeline"])}
              for k, m in enumerate(memory["sensors"])]
    chart = {"type": "lines", "series": series, "xUnit": "s", "yUnit": "B", "xName": "time",
             "xLabel": "time since the run started", "yLabel": "memory (peak per step)",
             "height": 220}
    peak = memory.get("peak_B")
    return {"rows": rows, "chart": chart,
            "peak": units.scaled(peak, "B") if peak is not None else None}


def _broken_points(timeline: dict[str, Any]) -> list[list[float | None]]:
    """The chart's [t, bytes] points, with [t, None] (the line stops) before each point that
    begins another repetition."""
    breaks = set(timeline.get("rep_starts") or [])
    points: list[list[float | None]] = []
    for i, (x, y) in enumerate(zip(timeline["t_s"], timeline["B"], strict=True)):
        if i in breaks:
            points.append([x, None])
        points.append([x, y])
    return points


def memory_csv(memory: dict[str, Any] | None, run_mode: str) -> str | None:
    """memory.csv: one row per timeline point of each gauge (seconds since the run started);
    `run_mode` (quick or careful) on every row, as in the other CSV files."""
    if not memory:
        return None
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["sensor", "provenance", "t_s", "bytes", "run_mode"])
    for m in memory["sensors"]:
        for x, y in zip(m["timeline"]["t_s"], m["timeline"]["B"], strict=True):
            writer.writerow([m["sensor"], m["provenance"], x, y, run_mode])
    return out.getvalue()
