"""Runs side by side (`fecomlite report A B C …`, `--all`, `--where KEY=VALUE`): one row per run
with its hyperparameters, program hash, settings, duration, peak memory and energy per domain,
and plots of energy and peak memory against each numeric hyperparameter that varies, one series
per combination of the other varying hyperparameters (runs of hidden=256 and of hidden=1024
against batch_size are two lines, never one zig-zag through both).

It answers "how do memory and energy follow the hyperparameters of training": the figures are
per repetition (the mean over a run's repetitions), so runs repeated a different number of times
compare. A hyperparameter is the run's detected or `--param` one; a sweep configuration's network
(width, depth, batch size, ...) counts as its hyperparameters too. Energy is above idle over the
program (start to end), ± 1σ (the repetitions' spread, the idle baseline's noise over the
program's time and the sensor's resolution), with its provenance. The program hash is of the
program file as it is now (the store keeps its path, not its bytes): a changed file shows a
different hash from the one a later run records, never a false match with an old run.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import statistics
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from fecomlite.analysis.run_analysis import (
    GPU_MEMORY_DOMAINS,
    RSS_SENSOR,
    analyse_run,
    finite_or_zero,
)
from fecomlite.report.compare import Comparison as RunsReport  # the same page's parts
from fecomlite.report.palette import SERIES_COLORS
from fecomlite.store import Store, StoreError

RUNS_FORMAT = "fecomlite-runs/1"
LISTED_KINDS = ("instrumented", "watch", "sweep-config")  # what --all lists


def select_runs(
    store: Store, ids: Sequence[int], *, every: bool = False, where: Sequence[str] = ()
) -> list[int]:
    """The runs to show: `ids`, or every finished run (`every`), kept where each KEY=VALUE holds
    (a hyperparameter, a setting, or a run field such as kind or program)."""
    conditions = [_condition(text) for text in where]
    if every:
        ids = store.run_ids(LISTED_KINDS, status="finished")
    elif not ids:
        ids = store.run_ids(status="finished")
    chosen = [int(i) for i in ids
              if all(_value_of(store.run(int(i)), key) == value for key, value in conditions)]
    if not chosen:
        raise StoreError("no run matches" + (f" {', '.join(where)}" if where else ""))
    return chosen


def _condition(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"--where takes KEY=VALUE, not {text!r}")
    return key.strip(), value.strip()


def _value_of(run: dict[str, Any], key: str) -> str | None:
    for source in (hyperparameters(run), run.get("settings") or {}, run):
        if key in source and not isinstance(source[key], (dict, list)):
            return str(source[key])
    return None


def hyperparameters(run: dict[str, Any]) -> dict[str, Any]:
    """Detected and given hyperparameters, and a sweep configuration's network; a number given
    as text (`--param batch_size=64`) is a number, so that it can be plotted."""
    found = dict((run.get("settings") or {}).get("network") or {})
    found.update({k: _number(v) for k, v in (run.get("hyperparams") or {}).items()
                  if k != "sources"})
    return found


def _number(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def run_row(store: Store, run_id: int, method: str = "overlap") -> dict[str, Any]:
    """One run's figures (see the module docstring)."""
    a = analyse_run(store, run_id, method, compare_levels=False)
    run = a.run
    reps = a.repetitions
    durations = [r["duration_s"] for r in a.per_rep if math.isfinite(r["duration_s"])]
    energy = {}
    for d in a.domains:
        per_rep = [r["energy"][d["domain"]]["above_idle_J"] for r in a.per_rep
                   if math.isfinite(r["energy"].get(d["domain"], {}).get("above_idle_J", math.nan))]
        n = max(len(per_rep), 1)
        mean = statistics.fmean(per_rep) if per_rep else d["program_J"]
        spread = statistics.stdev(per_rep) / math.sqrt(n) if len(per_rep) > 1 else 0.0
        sigma = math.sqrt(spread**2 + (finite_or_zero(d.get("noise_J")) / n) ** 2
                          + (finite_or_zero(d.get("resolution_J")) / n) ** 2)
        resolved = mean > 2 * sigma and mean > 0  # else: the bound it is below, never < 0
        energy[d["domain"]] = {
            "above_idle_J": mean if resolved else None, "sigma_J": sigma,
            "below_J": None if resolved else max(2 * sigma, abs(mean)),
            "provenance": d["provenance"], "model": d.get("model"),
            "reliable": d.get("reliable", True), "unreliable": d.get("unreliable") or [],
        }
    settings = {k: v for k, v in (run.get("settings") or {}).items()
                if k not in ("network", "params")}
    return {
        "id": run["id"], "kind": run["kind"], "status": run["status"], "level": run["level"],
        "program": run["program"], "program_sha256": _file_hash(run["program"]),
        "when": time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created_unix"])),
        "hyperparameters": hyperparameters(run),
        "hyperparameter_sources": (run.get("hyperparams") or {}).get("sources") or {},
        "given": sorted((run.get("settings") or {}).get("params") or {}),
        "settings": settings, "repetitions": len(reps),
        "duration_s": statistics.fmean(durations) if durations else None,
        **peak_memory(store, run_id, reps), "energy": energy, "method": a.method,
    }


def peak_memory(store: Store, run_id: int, reps: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The highest host RSS and GPU memory (summed over GPUs) sampled while the program ran."""
    sensors = store.sensors(run_id)
    gauges = [s for s in sensors if s["kind"] == "gauge" and s["unit"] == "B"]
    rss = [s for s in gauges if s["name"] == RSS_SENSOR] or [
        s for s in gauges if s["domain"] == "process-memory" and "peak" not in s["name"]][:1]
    gpu: list[dict[str, Any]] = []
    for domain in GPU_MEMORY_DOMAINS:
        gpu = gpu or [s for s in gauges if s["domain"] == domain]
    spans = [(r["t_start_ns"], r["t_end_ns"]) for r in reps
             if r.get("t_start_ns") is not None and r.get("t_end_ns") is not None]
    return {"rss_peak_B": _peak(store, rss, spans), "gpu_mem_peak_B": _peak(store, gpu, spans),
            "rss_sensor": rss[0]["name"] if rss else None,
            "gpu_memory_sensors": [s["name"] for s in gpu]}


def _peak(store: Store, sensors: Sequence[dict[str, Any]],
          spans: Sequence[tuple[int, int]]) -> float | None:
    if not sensors or not spans:
        return None
    peaks = []
    for start, end in spans:
        total = 0.0
        for s in sensors:
            value = store.max_sample(s["id"], start, end)
            if value is None:
                break
            total += value
        else:
            peaks.append(total)
    return max(peaks) if peaks else None


def runs_report(store: Store, run_ids: Sequence[int], method: str = "overlap") -> RunsReport:
    """The report over `run_ids`, each attributed with the same `method`."""
    rows = [run_row(store, run_id, method) for run_id in run_ids]
    domains = sorted({d for row in rows for d in row["energy"]})
    keys = list(dict.fromkeys(k for row in rows for k in row["hyperparameters"]))
    varying = [k for k in keys
               if len({repr(row["hyperparameters"].get(k)) for row in rows}) > 1]
    relations = [_relation(rows, key, domains, [k for k in varying if k != key])
                 for key in varying]
    charts = {}
    for rel in relations:
        if rel["numeric"]:
            charts[f"energy-{rel['hyperparameter']}"] = _chart(rel, domains, "energy")
            charts[f"memory-{rel['hyperparameter']}"] = _chart(rel, domains, "memory")
    data = {"format": RUNS_FORMAT, "method": method, "domains": domains,
            "hyperparameters": keys, "varying": varying, "runs": rows, "relations": relations}
    context = {
        "title": f"{len(rows)} runs side by side", "generated": time.strftime("%Y-%m-%d %H:%M:%S"),
        "rows": rows, "domains": domains, "keys": keys, "varying": varying, "method": method,
        "relations": relations,
        "provenance": {d: sorted({f"{r['energy'][d]['provenance']}"
                                  + (f" ({r['energy'][d]['model']})"
                                     if r["energy"][d]["model"] else "")
                                  for r in rows if d in r["energy"]}) for d in domains},
    }
    return RunsReport(context, charts, data, {"runs": runs_csv(rows, keys, domains)})


def _relation(rows: Sequence[dict[str, Any]], key: str, domains: Sequence[str],
              others: Sequence[str] = ()) -> dict[str, Any]:
    """Energy per domain and peak memory at each value of one hyperparameter, run by run; each
    point's `group`: the values of the `others` that vary, which its series is drawn by."""
    points = [
        {"value": row["hyperparameters"].get(key), "run": row["id"],
         "group": {k: row["hyperparameters"].get(k) for k in others},
         "energy_J": {d: row["energy"][d]["above_idle_J"] for d in domains if d in row["energy"]},
         "sigma_J": {d: row["energy"][d]["sigma_J"] for d in domains if d in row["energy"]},
         "rss_peak_B": row["rss_peak_B"], "gpu_mem_peak_B": row["gpu_mem_peak_B"]}
        for row in rows
    ]
    numeric = all(isinstance(p["value"], (int, float)) and not isinstance(p["value"], bool)
                  for p in points)
    if numeric:
        points.sort(key=lambda p: p["value"])
    return {"hyperparameter": key, "numeric": numeric, "points": points,
            "others": list(others)}


def _groups(rel: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """(label, points) per combination of the other varying hyperparameters, in order of
    appearance ("" for the one group when nothing else varies)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in rel["points"]:
        label = ", ".join(f"{k}={v}" for k, v in p["group"].items())
        groups.setdefault(label, []).append(p)
    return list(groups.items())


def _chart(rel: dict[str, Any], domains: Sequence[str], what: str) -> dict[str, Any]:
    key = rel["hyperparameter"]
    values = [p["value"] for p in rel["points"]]
    if what == "energy":
        lines = [(d, lambda p, d=d: p["energy_J"].get(d)) for d in domains]
        unit, label = "J", "energy above idle per repetition"
    else:
        lines = [(name, lambda p, f=field: p[f]) for name, field in
                 (("host RSS", "rss_peak_B"), ("GPU memory", "gpu_mem_peak_B"))]
        unit, label = "B", "peak memory"
    series = []
    for name, value in lines:
        for group, points in _groups(rel):
            series.append({
                "label": f"{name}, {group}" if group else name,
                "color": SERIES_COLORS[len(series) % len(SERIES_COLORS)], "markers": True,
                "points": [[p["value"], value(p)] for p in points if value(p) is not None]})
    positive = min(values) > 0
    return {"type": "lines", "series": [s for s in series if s["points"]],
            "xLog": positive and max(values) / min(values) >= 10, "yZero": True,
            "xName": key, "yName": label, "xLabel": key, "yLabel": label, "yUnit": unit,
            "height": 260}


def runs_csv(rows: Sequence[dict[str, Any]], keys: Sequence[str], domains: Sequence[str]) -> str:
    """One line per run: hyperparameters, hash, duration, peak memory, energy per domain."""
    columns = ["run", "kind", "program", "program_sha256", "repetitions", "duration_s",
               "rss_peak_B", "gpu_mem_peak_B", *keys]
    for d in domains:
        columns += [f"energy_J_{d}", f"sigma_J_{d}", f"below_J_{d}", f"provenance_{d}"]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, restval="")
    writer.writeheader()
    for row in rows:
        line = {"run": row["id"], "kind": row["kind"], "program": row["program"],
                "program_sha256": row["program_sha256"] or "",
                "repetitions": row["repetitions"], "duration_s": row["duration_s"],
                "rss_peak_B": row["rss_peak_B"], "gpu_mem_peak_B": row["gpu_mem_peak_B"],
                **{k: row["hyperparameters"].get(k, "") for k in keys}}
        for d, e in row["energy"].items():
            line.update({f"energy_J_{d}": e["above_idle_J"], f"sigma_J_{d}": e["sigma_J"],
                         f"below_J_{d}": e["below_J"],
                         f"provenance_{d}": e["provenance"]
                         + (f" ({e['model']})" if e["model"] else "")})
        writer.writerow({k: "" if v is None else v for k, v in line.items()})
    return out.getvalue()


def write_runs(report: RunsReport, out_dir: Path, formats: Iterable[str]) -> list[Path]:
    """index.html, runs.json and runs.csv (those of `formats`)."""
    from fecomlite.report.render import render_page, write_files

    formats = set(formats)
    html = (render_page("runs.html.j2", report.context, report.charts)
            if "html" in formats else None)
    return write_files(out_dir, html, report.json, report.csv, "runs.json", formats)


def _file_hash(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None

