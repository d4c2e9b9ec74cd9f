"""The timeline's data, small enough for a page: power per domain, memory and call spans.

Power keeps the energy: each drawn step is the mean power of its bin (differences of the
cumulative energy at the bin edges), so the area under the drawn curve is the sensor's energy.
Memory keeps the peaks (the maximum per bin). Call spans are drawn one by one while there are
few; past that, per API the share of each bin in which a call of that API was running.
All of it is numpy over whole arrays; nothing loops per sample or per call.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis.pieces import is_call
from fecomlite.analysis.run_analysis import RunAnalysis
from fecomlite.report.palette import (
    MEMORY_COLORS,
    SERIES_COLORS,
    domain_color,
    domain_name,
    shade,
)
from fecomlite.store import Store

MAX_POINTS = 2000  # per series
MAX_LANES = 8  # the costliest APIs get a lane each
MAX_SPANS = 6000  # individual spans drawn in all lanes together; beyond, lanes are binned
TAIL_LEAD_S = 1.0  # how much of the program's end the tail chart shows before the tail


def samples(store: Store, sensor_id: int) -> tuple[np.ndarray, np.ndarray]:
    """One sensor's samples, ordered by time, as (t_ns int64, value float64)."""
    return store.sample_arrays(sensor_id)


def power_steps(kind: str, t_ns: np.ndarray, values: np.ndarray,
                period_s: float | None) -> tuple[np.ndarray, np.ndarray]:
    """(edges_ns, power_W) of a counter (J) or power (W) series, as the attribution sees it."""
    iv = at.sensor_intervals(kind, t_ns, values, period_s=period_s)
    return iv.edges_ns, iv.power_W


def rebin_power(edges_ns: np.ndarray, power_W: np.ndarray, bins_ns: np.ndarray) -> np.ndarray:
    """Mean power over the covered part of each of `bins_ns`' intervals, conserving energy
    (NaN where a bin holds no data)."""
    energy = np.concatenate(([0.0], np.cumsum(power_W * np.diff(edges_ns) / at.NS)))
    at_bins = np.interp(bins_ns, edges_ns, energy)
    lo = np.maximum(bins_ns[:-1], edges_ns[0])
    hi = np.minimum(bins_ns[1:], edges_ns[-1])
    width = (hi - lo) / at.NS
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(width > 0, np.diff(at_bins) / width, np.nan)


def peak_per_bin(t_ns: np.ndarray, values: np.ndarray, bins_ns: np.ndarray) -> tuple[
        np.ndarray, np.ndarray]:
    """(bin start, max value) of the bins that hold samples."""
    which = np.searchsorted(bins_ns, t_ns, "right") - 1
    ok = (which >= 0) & (which < bins_ns.size - 1)
    which, vals = which[ok], values[ok]
    if which.size == 0:
        return np.zeros(0, np.int64), np.zeros(0)
    starts = np.flatnonzero(np.concatenate(([True], np.diff(which) != 0)))
    return bins_ns[which[starts]], np.maximum.reduceat(vals, starts)


class GaugePeaks:
    """A gauge's samples read chunk by chunk (`Store.sample_chunks`), in the memory of a chunk
    and the bins: as they are while there are at most `raw_max`, else the peak per bin
    (`peak_per_bin`, the same figures as over the whole series at once)."""

    def __init__(self, bins_ns: np.ndarray, raw_max: int) -> None:
        self.bins = bins_ns
        self.raw_max = raw_max
        self.peak = np.full(max(bins_ns.size - 1, 0), -np.inf)
        self.seen = np.zeros(self.peak.size, bool)
        self.raw: list[tuple[np.ndarray, np.ndarray]] = []
        self.count = 0

    def add(self, t_ns: np.ndarray, values: np.ndarray) -> None:
        self.count += t_ns.size
        if self.count <= self.raw_max:
            self.raw.append((t_ns, values))
        else:
            self.raw.clear()
        starts, peaks = peak_per_bin(t_ns, values, self.bins)  # a bin may span two chunks
        which = np.searchsorted(self.bins, starts)
        np.maximum.at(self.peak, which, peaks)
        self.seen[which] = True

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        """(t_ns, value): the samples, or (bin start, peak) of the bins that hold some."""
        if self.count <= self.raw_max:
            if not self.raw:
                return np.zeros(0, np.int64), np.zeros(0)
            return (np.concatenate([t for t, _ in self.raw]),
                    np.concatenate([v for _, v in self.raw]))
        return self.bins[:-1][self.seen], self.peak[self.seen]


def busy_per_bin(t0: np.ndarray, t1: np.ndarray, bins_ns: np.ndarray) -> np.ndarray:
    """Σ over calls of their overlap with each bin, as a share of the bin (may pass 1 when calls
    overlap: nested or on several threads; clipped to 1 for drawing)."""
    def covered_until(x: np.ndarray) -> np.ndarray:  # Σ_calls |[t0, t1] ∩ (−∞, x]|
        s0, s1 = np.sort(t0).astype(float), np.sort(t1).astype(float)
        c0 = np.concatenate(([0.0], np.cumsum(s0)))
        c1 = np.concatenate(([0.0], np.cumsum(s1)))
        k0, k1 = np.searchsorted(s0, x, "right"), np.searchsorted(s1, x, "right")
        return (k0 * x - c0[k0]) - (k1 * x - c1[k1])

    x = bins_ns.astype(float)
    cov = covered_until(x)
    return np.clip(np.diff(cov) / np.diff(x), 0.0, 1.0)


def broken_at(t: np.ndarray, v: np.ndarray, ends: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A gauge's samples with a gap (NaN, drawn as a break) after the last sample before each
    of `ends` (a repetition's program ended): no line across gate waits and pauses, when no
    process existed to have memory."""
    if t.size < 2 or not ends:
        return t, v
    after = np.searchsorted(t, np.asarray(ends, np.int64), "left")
    cut = np.unique(after[(after > 0) & (after < t.size)])
    return (np.insert(t, cut, t[cut - 1] + 1).astype(np.int64),
            np.insert(v.astype(float), cut, np.nan))


def _round(values: np.ndarray, decimals: int) -> list[float | None]:
    out = np.round(np.asarray(values, float), decimals)
    return [None if not math.isfinite(v) else v for v in out.tolist()]


def _decimals(span_s: float, points: int) -> int:
    """Enough decimals to tell neighbouring points apart on a span of `span_s` seconds."""
    step = span_s / max(points, 1)
    return int(min(9, max(3, 2 - math.floor(math.log10(step)) if step > 0 else 6)))


def _sig(values: np.ndarray, digits: int = 4) -> list[float | None]:
    """Values rounded to `digits` significant digits (power and memory need no more)."""
    v = np.asarray(values, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        mag = np.where(np.isfinite(v) & (v != 0), np.floor(np.log10(np.abs(v))), 0)
        scale = 10.0 ** (digits - 1 - mag)
        out = np.round(v * scale) / scale
    return [None if not math.isfinite(x) else float(x) for x in out.tolist()]


class TimelineBuilder:
    """Reads a run's samples once and gives the timeline and the tail charts their data."""

    def __init__(self, store: Store, analysis: RunAnalysis) -> None:
        self.analysis = analysis
        run, calls = analysis.run, analysis.call_columns()
        by_name = {s["name"]: s for s in store.sensors(run["id"])}
        self.power: list[dict[str, Any]] = []
        for d in analysis.domains:
            sensor = by_name.get(d["sensor"])
            if sensor is None:
                continue
            t, v = samples(store, sensor["id"])
            try:
                edges, power = power_steps(sensor["kind"], t, v, sensor.get("period_s"))
            except ValueError:
                continue
            if power.size:
                self.power.append({"domain": d, "edges": edges, "power": power})
        self.store = store
        self.memory: list[dict[str, Any]] = []  # gauges: read chunk by chunk when drawn
        for key, sensor in self._memory_sensors(list(by_name.values())):
            span = store.sample_span(sensor["id"])
            if span is not None:
                self.memory.append({"key": key, "sensor": sensor, "span": span})
        starts = [int(calls["t_start_ns"].min())] if calls["t_start_ns"].size else []
        ends = [int(calls["t_end_ns"].max())] if calls["t_end_ns"].size else []
        for p in self.power:
            starts.append(int(p["edges"][0]))
            ends.append(int(p["edges"][-1]))
        for m in self.memory:
            starts.append(m["span"][0])
            ends.append(m["span"][1])
        for r in analysis.repetitions:
            ends += [int(x) for x in (r.get("tail_end_ns"), r.get("t_end_ns")) if x is not None]
        origin = run.get("t_start_ns")
        self.t_lo = min(starts) if starts else (origin or 0)
        self.t_hi = max(ends) if ends else self.t_lo + int(at.NS)
        if self.t_hi <= self.t_lo:
            self.t_hi = self.t_lo + int(at.NS)
        self.origin = int(origin) if origin is not None else self.t_lo

    @staticmethod
    def _memory_sensors(sensors: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        """The process RSS gauge and the GPU memory gauges the analysis uses for calls."""
        out = []
        rss = next((s for s in sensors if s["name"] == "proc:rss"), None) or next(
            (s for s in sensors if s["domain"] == "process-memory" and s["kind"] == "gauge"
             and "peak" not in s["name"]), None)
        if rss is not None:
            out.append(("rss", rss))
        for domain in ("process-gpu-memory", "gpu-memory"):
            gpu = [s for s in sensors if s["domain"] == domain and s["kind"] == "gauge"]
            if gpu:
                out += [("gpu_memory", s) for s in gpu]
                break
        return out

    def _rel(self, t_ns: np.ndarray | int) -> np.ndarray:
        return (np.asarray(t_ns, np.int64) - self.origin) / at.NS

    def _process_ends(self) -> list[int]:
        """When each repetition's program ended (its memory with it)."""
        return [int(r["t_end_ns"]) for r in self.analysis.repetitions
                if r.get("t_end_ns") is not None]

    def timeline(self) -> dict[str, Any]:
        """FecomCharts.timeline's data: series (W), memory (B), lanes, marks, range (s)."""
        bins = np.linspace(self.t_lo, self.t_hi, MAX_POINTS + 1).astype(np.int64)
        bins = np.unique(bins)
        span_s = (self.t_hi - self.t_lo) / at.NS
        dec = _decimals(span_s, 20 * MAX_POINTS)
        series = []
        for p in self.power:
            d = p["domain"]
            if p["power"].size <= MAX_POINTS:
                edges, power = p["edges"], p["power"]
            else:
                edges, power = bins, rebin_power(p["edges"], p["power"], bins)
            series.append({
                "label": _domain_label(d), "domain": d["domain"],
                "color": domain_color(d["domain"]), "unit": "W",
                "t": _round(self._rel(edges), dec), "v": _sig(power),
                "idle": _sig(np.array([d["idle_W"]]))[0], "provenance": d["provenance"],
            })
        memory = []
        for m in self.memory:
            peaks = GaugePeaks(bins, MAX_POINTS)
            for chunk in self.store.sample_chunks(m["sensor"]["id"]):
                peaks.add(chunk["t"], chunk["v"])
            t, v = broken_at(*peaks.result(), self._process_ends())
            memory.append({
                "label": _memory_label(m["key"], m["sensor"]),
                "color": MEMORY_COLORS[m["key"]], "unit": "B",
                "t": _round(self._rel(t), dec), "v": _sig(v),
            })
        return {
            "type": "timeline", "series": series, "memory": memory,
            "lanes": self._lanes(bins, dec), "marks": self._marks(dec),
            "range": [round(float(self._rel(self.t_lo)), dec),
                      round(float(self._rel(self.t_hi)), dec)],
        }

    def _lanes(self, bins: np.ndarray, dec: int) -> list[dict[str, Any]]:
        a, calls = self.analysis, self.analysis.call_columns()
        names = a.api_names  # the order of calls["api"]'s indices
        index = {n: i for i, n in enumerate(names)}
        top = [r["api"] for r in a.apis[:MAX_LANES] if r["api"] in index]
        lanes = []
        groups = [np.flatnonzero(calls["api"] == index[name]) for name in top]
        spans = sum(g.size for g in groups) <= MAX_SPANS
        for k, (name, idx) in enumerate(zip(top, groups, strict=True)):
            t0, t1 = calls["t_start_ns"][idx], calls["t_end_ns"][idx]
            lane: dict[str, Any] = {"label": name, "color": SERIES_COLORS[k % len(SERIES_COLORS)]}
            if spans:
                order = np.argsort(t0, kind="stable")
                t0, t1 = t0[order], t1[order]
                lane["spans"] = {
                    "t0": _round(self._rel(t0), dec), "t1": _round(self._rel(t1), dec),
                    "maxDur": float((t1 - t0).max() / at.NS) if t0.size else 0.0,
                }
            else:
                counts = np.histogram(t0[is_call(calls["status"][idx])], bins)[0]  # not pieces
                lane["bins"] = {
                    "t0": round(float(self._rel(bins[0])), dec),
                    "dt": float(np.diff(bins).mean() / at.NS),
                    "busy": _sig(busy_per_bin(t0, t1, bins), 3),
                    "calls": counts.tolist(),
                }
            lanes.append(lane)
        return lanes

    def _marks(self, dec: int) -> list[dict[str, Any]]:
        marks = []
        for r in self.analysis.repetitions:
            a, b, c = r.get("t_start_ns"), r.get("t_end_ns"), r.get("tail_end_ns")
            if a is not None and b is not None:
                marks.append({"t0": round(float(self._rel(a)), dec),
                              "t1": round(float(self._rel(b)), dec),
                              "label": f"rep {r['rep']}", "kind": "rep"})
            if b is not None and c is not None and c > b:
                marks.append({"t0": round(float(self._rel(b)), dec),
                              "t1": round(float(self._rel(c)), dec),
                              "label": "tail", "kind": "tail"})
        return marks

    def tails(self) -> list[dict[str, Any]]:
        """One FecomCharts.lines chart per domain: power from just before each repetition's end
        through its tail, on a time axis relative to the program's end."""
        reps = [r for r in self.analysis.repetitions
                if r.get("t_end_ns") is not None and r.get("tail_end_ns") is not None
                and r["tail_end_ns"] > r["t_end_ns"]]
        charts = []
        for p in self.power:
            d = p["domain"]
            edges, power = p["edges"], p["power"]
            series = []
            for k, r in enumerate(reps):
                a, b = r["t_end_ns"] - int(TAIL_LEAD_S * at.NS), r["tail_end_ns"]
                lo = max(int(np.searchsorted(edges, a, "right")) - 1, 0)
                hi = min(int(np.searchsorted(edges, b, "left")), power.size)
                if hi <= lo:
                    continue
                x = (edges[lo:hi + 1] - r["t_end_ns"]) / at.NS
                y = power[lo:hi]
                if y.size > MAX_POINTS // 4:
                    grid = np.linspace(edges[lo], edges[hi], MAX_POINTS // 4 + 1).astype(np.int64)
                    y = rebin_power(edges, power, grid)
                    x = (grid - r["t_end_ns"]) / at.NS
                pts = np.column_stack((np.repeat(x, 2)[1:-1], np.repeat(y, 2)))
                series.append({
                    "label": f"rep {r['rep']}", "color": _shade(d["domain"], k, len(reps)),
                    "points": [[round(float(px), 4), py] for px, py in
                               zip(pts[:, 0], _sig(pts[:, 1]), strict=True)],
                })
            if series:
                charts.append({
                    "type": "lines", "title": _domain_label(d), "series": series,
                    "xUnit": "s", "yUnit": "W", "xName": "after the program ended",
                    "xLabel": "time after the program ended", "yLabel": "power",
                    "yZero": False, "height": 200,
                })
        return charts


def _shade(domain: str, k: int, n: int) -> str:
    return shade(domain_color(domain), k, n)


def _domain_label(d: dict[str, Any]) -> str:
    prov = d["provenance"] + (f", {d['model']}" if d.get("model") else "")
    return f"{domain_name(d['domain'])} ({prov})"


def _memory_label(key: str, sensor: dict[str, Any]) -> str:
    what = "process RSS" if key == "rss" else "GPU memory"
    return f"{what} ({sensor['provenance']}, {sensor['name']})"
