"""What the report shows, gathered from a `RunAnalysis` (and the store, for samples and results).

`build_report` returns a `Report`: the templates' context, the charts' data (embedded in the page
as JSON) and the machine-readable files. Nothing here formats HTML; `render` does.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import shlex
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import collectives, noise_floor, units
from fecomlite.analysis.baseline_text import described
from fecomlite.analysis.carbon import Intensity
from fecomlite.analysis.exit_status import exit_description
from fecomlite.analysis.ranks import add_rank_figures
from fecomlite.analysis.run_analysis import RunAnalysis, analyse_run, mean_ci95
from fecomlite.report import first_use, tables
from fecomlite.report import layers as layer_report
from fecomlite.report.co2e import add_co2e, csv_with_co2e
from fecomlite.report.distributed import rank_section
from fecomlite.report.domains import stacked_domains
from fecomlite.report.model_section import model_section
from fecomlite.report.palette import SERIES_COLORS, domain_color, domain_name, shade
from fecomlite.report.process_memory import memory_context, memory_csv, process_memory
from fecomlite.report.tf_strategy import strategy_section
from fecomlite.report.timeline import TimelineBuilder
from fecomlite.sensors.estimate import MODELS
from fecomlite.store import Store

TOP_BARS = 15  # APIs in the "top APIs by energy" chart
MAX_INTENSITY_ROWS = 50
DATASIZE_METRICS = (("energy_J", "J", "energy"), ("seconds", "s", "time"),
                    ("mem_added_B", "B", "memory added during its calls"))


@dataclass
class Report:
    """One run's report: `context` for the templates, `charts` for the page's scripts, and the
    files written beside the page (`json` as report.json, `csv` as apis.csv / sites.csv)."""

    run_id: int
    analysis: RunAnalysis
    context: dict[str, Any]
    charts: dict[str, Any]
    json: dict[str, Any]
    csv: dict[str, str]


def build_report(store: Store, run_id: int, method: str = "auto",
                 analysis: RunAnalysis | None = None, intensity: Intensity | None = None) -> Report:
    """Analyse run `run_id` (unless `analysis` is given) and gather everything the report shows."""
    a = analysis or analyse_run(store, run_id, method)
    ranks = add_rank_figures(a, store.processes(run_id))  # distributed runs only
    layer_notes = layer_report.annotate(a, store.result(run_id, "layers") or {})  # --trace-layers
    collectives.annotate(a)  # kind "collective", and the call that launched DDP's all-reduce
    tf_distribute = strategy_section(a)  # what a tf.distribute run can and cannot show
    if tf_distribute is not None and tf_distribute["note"] not in a.notes:
        a.notes.append(tf_distribute["note"])
    timeline = TimelineBuilder(store, a)
    datasize = store.result(run_id, "datasize")
    gpu_mem = tables.has_gpu_memory(a.apis)
    bucket_s = tables.bucket_width(a.apis)  # --keep: some calls come from buckets
    api_cols = tables.api_columns(a.domains, gpu_mem, bucket_s)
    site_cols = tables.site_columns(a.domains, gpu_mem, bucket_s)
    co2e = add_co2e(a, intensity, [api_cols, site_cols])  # None without an intensity
    tails = timeline.tails()
    memory = process_memory(store, a.run, a.repetitions)  # every run kind: a watch run's only
    memory_view = memory_context(memory)
    charts: dict[str, Any] = {
        "bars": _bars_chart(a),
        "timeline": timeline.timeline(),
        "scatter": _scatter_chart(a),
        "memory": _memory_chart(a),
        **{f"tail-{i}": chart for i, chart in enumerate(tails)},
    }
    if memory_view:
        charts["process-memory"] = memory_view["chart"]
    levels = _levels(a)
    if levels:
        charts["levels"] = levels["chart"]
    ds = _datasize(datasize)
    if ds:
        charts.update(ds["charts"])
    model = model_section(store, a)
    if model:
        charts.update(model.charts)
    context = {
        "title": f"{_program_name(a.run)} — run {run_id}",
        "generated": _when(time.time()),
        "header": _header(a),
        "machine": _machine(a.run.get("machine") or {}),
        "domains": [_domain_card(a, d) for d in a.domains],
        "sensors": _sensors(a),
        "idle": _idle(store, a),
        "reps": _reps(a),
        "settings": _items(a.run.get("settings") or {}),
        "hyperparams": _hyperparam_items(a.run.get("hyperparams") or {}),
        "api_table": _table("apis", api_cols, a.apis, functools.partial(
            _api_extra, imported=first_use.imports_by_api(
                store.result(run_id, "shapes") or {}, a.sites)), a.domains),
        "site_table": _table("sites", site_cols, a.sites, _site_extra, a.domains),
        "intensities": _intensities(a),
        "replays": _replays(store, a),
        "levels": levels,
        "ranks": rank_section(a, ranks),
        "datasize": ds,
        "model": model.context if model else None,
        "tails": [{"key": f"tail-{i}", "title": c["title"]} for i, c in enumerate(tails)],
        "notes": a.notes,
        "method": a.method,
        "load": a.load,
        "stacked": ", ".join(domain_name(d["domain"]) for d in stacked_domains(a)),
        "co2e": co2e,
        "layers": {"tree": layer_report.tree(a), "notes": layer_notes,
                   "domains": layer_report.tree_domains(a)},
        "process_memory": memory_view,
    }
    report_json = {"format": 1, **a.to_json(), "ranks": ranks, "datasize": datasize,
                   "co2e": co2e, "layer_notes": layer_notes,
                   "tf_distribute": tf_distribute, "process_memory": memory}
    csv_tables = a.tables_csv()
    if co2e:
        rows = {"apis": a.apis, "sites": a.sites}
        csv_tables = {k: csv_with_co2e(v, rows[k], co2e["label"]) for k, v in csv_tables.items()}
    mode = (a.mode or {}).get("mode", "")
    memory_rows = memory_csv(memory, mode)
    if memory_rows:
        csv_tables["memory"] = memory_rows
    scaling = datasize_csv(datasize, mode)
    if scaling:
        csv_tables["datasize_apis"] = scaling
    return Report(run_id, a, context, charts, report_json, csv_tables)


# -- header -----------------------------------------------------------------------------------


def _program_name(run: dict[str, Any]) -> str:
    return run.get("program") or "(unnamed program)"


def _when(unix: float | None) -> str:
    if unix is None:
        return "–"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(unix))


def _header(a: RunAnalysis) -> dict[str, Any]:
    run = a.run
    t0, t1 = run.get("t_start_ns"), run.get("t_end_ns")
    reps = a.repetitions
    rep_time = sum((r["t_end_ns"] - r["t_start_ns"]) / 1e9 for r in reps
                   if r.get("t_end_ns") is not None and r.get("t_start_ns") is not None)
    argv = run.get("argv") or []
    settings = run.get("settings") or {}
    return {
        "program": _program_name(run),
        "command": shlex.join(str(x) for x in argv) if argv else "",
        "run_id": run["id"],
        "kind": run.get("kind"),
        "level": run.get("level"),
        "status": run.get("status"),
        "partial": run.get("status") == "running",  # still recording: what is stored so far
        "keep": settings.get("keep"),  # bounded storage: WINDOW/BUCKET, calls between in buckets
        "lost_events": run.get("lost_events", 0),  # events neither sent nor spooled
        "exit_code": run.get("exit_code"),
        "ended": _ended(run.get("exit_code")),
        "when": _when(run.get("created_unix")),
        "duration": units.scaled((t1 - t0) / 1e9, "s") if t0 is not None and t1 else "–",
        "program_time": units.scaled(rep_time, "s") if reps else "–",
        "repetitions": len(reps),
        "calls": sum(r["calls"] for r in a.apis),  # a streamed run keeps no call's columns
        "apis": len(a.apis),
        "sites": len(a.sites),
        "sync": settings.get("sync_used", settings.get("sync")),
        "parent_id": run.get("parent_id"),
        "mode": a.mode,
    }


def _machine(m: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    if m.get("cpu_model") or m.get("cpu_logical"):
        cpus = f"{m.get('cpu_logical', '?')} logical CPUs"
        if m.get("cpu_affinity") and m.get("cpu_affinity") != m.get("cpu_logical"):
            cpus += f", {m['cpu_affinity']} usable"
        out.append(("CPU", f"{m.get('cpu_model') or 'unknown'} ({cpus})"))
    if m.get("memory_bytes"):
        out.append(("memory", units.scaled(float(m["memory_bytes"]), "B")))
    gpus = m.get("gpus")
    if gpus:
        out.append(("GPUs", "; ".join(
            f"{g.get('index', i)}: {g.get('name', '?')}"
            + (f", {units.scaled(float(g['memory_bytes']), 'B')}" if g.get("memory_bytes") else "")
            + (f", driver {g['driver']}" if g.get("driver") else "")
            for i, g in enumerate(gpus))))
    elif "gpus" in m:
        out.append(("GPUs", "none found"))
    for key, label in (("hostname", "host"), ("os", "OS"), ("python", "Python")):
        if m.get(key):
            out.append((label, str(m[key])))
    return out


def _no_share(d: dict[str, Any]) -> str:
    """Why a domain's card gives no share of the program's energy, as it is."""
    if noise_floor.below_zero(d["program_J"], d.get("noise_J") or 0.0) == (
            noise_floor.BEYOND_NOISE):
        return "no share: the program's energy is below the idle baseline"
    return "no share: the program's energy is within noise"


def _domain_card(a: RunAnalysis, d: dict[str, Any]) -> dict[str, Any]:
    """One domain's figures as `analysis` defines them: the program's above-idle energy leads,
    split into calls and outside calls; tail and baseline/gate/pauses stand apart."""
    per_rep = np.array([r["energy"].get(d["domain"], {}).get("above_idle_J", math.nan)
                        for r in a.per_rep], float)
    mean, lo, hi = mean_ci95(per_rep) if per_rep.size else (math.nan, math.nan, math.nan)
    intens = a.intensities.get(d["domain"]) or {}
    program = units.with_noise(d["program_J"], d.get("noise_J"))
    share = a.share_in_calls.get(d["domain"])
    return {
        "key": d["domain"], "name": domain_name(d["domain"]), "color": domain_color(d["domain"]),
        "sensor": d["sensor"], "provenance": d["provenance"], "model": d.get("model"),
        "model_text": MODELS.get(d.get("model") or "", ""),
        "role": d.get("role"), "meaning": d.get("meaning", ""), "of": d.get("of"),
        "reliable": d.get("reliable", True), "unreliable": d.get("unreliable") or [],
        "load_effect": d.get("load_effect"),
        "total": units.scaled(d["total_J"], "J"), "total_wh": units.watt_hours(d["total_J"]),
        "above": units.with_noise(d["above_idle_J"], d.get("above_noise_J")),
        "program": program,
        "in_calls": units.with_noise(d["in_calls_J"], d.get("outside_calls_noise_J")),
        "share_in_calls": (f"{units.percent(share)} of the program's "
                           f"{units.scaled(d['program_J'], 'J')}"
                           if share is not None and math.isfinite(share)
                           else _no_share(d)),
        "outside": units.with_noise(d["outside_calls_J"], d.get("outside_calls_noise_J")),
        "tail": units.with_noise(d["tail_J"], d.get("tail_noise_J")),
        "other": units.with_noise(d.get("other_J"), d.get("other_noise_J")),
        "idle": units.scaled(d["idle_W"], "W"), "idle_source": d.get("idle_source", ""),
        "period": units.scaled(d.get("period_s"), "s"),
        "per_rep": units.with_noise(mean, (hi - lo) / 2 if math.isfinite(lo) else
                                    d.get("noise_J", math.nan) / max(len(a.per_rep), 1)),
        "method": d.get("method"), "fell_back": d.get("fell_back"),
        "method_reason": intens.get("reason", ""),
        "method_sentence": _method_sentence(d, intens),
    }


def _method_sentence(d: dict[str, Any], intens: dict[str, Any]) -> str:
    """Why the energy of a sensor interval was shared the way it was, in one sentence."""
    reason = intens.get("reason", "")
    if d.get("method") == "intensity":
        how = "Each API's calls are charged by their own fitted power"
    else:
        how = "Every call active in a sensor interval is charged alike (by its time)"
    return f"{how}: {reason}." if reason else f"{how}."


def _sensors(a: RunAnalysis) -> list[dict[str, Any]]:
    used = {d["sensor"]: d["domain"] for d in a.domains}
    rows = []
    for s in a.sensors:
        model = s.get("model")
        rows.append({
            "name": s["name"], "domain": s["domain"], "kind": s["kind"], "unit": s["unit"],
            "provenance": s["provenance"], "model": model,
            "model_text": MODELS.get(model or "", ""),
            "period": units.scaled(s.get("period_s"), "s"),
            "description": s.get("description") or "",
            "used_for": used.get(s["name"], ""),
        })
    return rows


def _idle(store: Store, a: RunAnalysis) -> dict[str, Any]:
    detail = store.result(a.run["id"], "idle_baseline") or {}
    stats = detail.get("sensors") or {}
    rows = []
    for name, value in (a.run.get("idle") or {}).items():
        mean = value.get("mean_w") if isinstance(value, dict) else value
        s = stats.get(name) or {}
        rows.append({"sensor": name, "mean": units.scaled(mean, "W"),
                     "std": units.scaled(s.get("std_w"), "W") if s.get("std_w") else "–",
                     "provenance": s.get("provenance", ""), "n": s.get("n", "")})
    return {"rows": rows, "source": described(detail) if stats else None,
            "estimated": [d for d in a.domains if d.get("idle_source", "").startswith("estimated")]}


def _reps(a: RunAnalysis) -> list[dict[str, Any]]:
    by_rep = {r["rep"]: r for r in a.repetitions}
    rows = []
    for p in a.per_rep:
        r = by_rep.get(p["rep"], {})
        gate = r.get("gate") or {}
        tail_s = None
        if r.get("tail_end_ns") is not None and r.get("t_end_ns") is not None:
            tail_s = (r["tail_end_ns"] - r["t_end_ns"]) / 1e9
        energy = []
        for d in a.domains:
            e = p["energy"].get(d["domain"], {})
            sigma = d.get("idle_sigma_W", math.nan)
            noise = sigma * p["duration_s"] if math.isfinite(p.get("duration_s", math.nan)) \
                else math.nan
            energy.append({
                "above": units.with_noise(e.get("above_idle_J"), noise, short=True),
                "in_calls": units.with_noise(e.get("in_calls_J"), noise, short=True),
                "tail": units.with_noise(e.get("tail_J"), sigma * (tail_s or 0.0), short=True)})
        rows.append({
            "rep": p["rep"], "duration": units.scaled(p.get("duration_s"), "s"),
            "exit_code": p.get("exit_code"), "calls": p.get("calls", 0),
            "tail": units.scaled(tail_s, "s"), "energy": energy,
            "gate": _gate(gate), "extra": r.get("extra") or {},
        })
    return rows


def _gate(gate: dict[str, Any]) -> dict[str, Any]:
    if not gate:
        return {"state": "none", "label": "no gate", "waited": "–", "checks": [], "reasons": [],
                "not_checked": []}
    passed, gated = gate.get("passed"), gate.get("gated", True)
    state = "passed" if passed and gated else ("not gated" if not gated else "failed")
    checks = []
    for c in gate.get("checked") or []:
        value, limit = c.get("value"), c.get("limit")
        checks.append({
            "sensor": c.get("sensor", ""), "check": c.get("check", ""),
            "value": "–" if value is None else units.sig3(float(value)),
            "limit": "–" if limit is None else units.sig3(float(limit)),
            "state": "pending" if c.get("pending") else ("passed" if c.get("passed") else "failed"),
            "n": f"{c.get('n', '')}/{c.get('needed', '')}",
            "provenance": c.get("provenance", ""),
        })
    return {"state": state, "label": state, "waited": units.scaled(gate.get("waited_s"), "s"),
            "checks": checks, "reasons": gate.get("reasons") or [],
            "not_checked": gate.get("not_checked") or []}


def _hyperparam_items(hyperparams: dict[str, Any]) -> list[tuple[str, str]]:
    """Hyperparameters as (key, text), each with where the program was seen to use it (the
    probe's `sources`), rather than that record as one more row of JSON."""
    sources = hyperparams.get("sources")
    sources = sources if isinstance(sources, dict) else {}
    return [(key, f"{text} (read from {sources[key]})" if key in sources else text)
            for key, text in _items({k: v for k, v in hyperparams.items() if k != "sources"})]


def _items(mapping: dict[str, Any]) -> list[tuple[str, str]]:
    """Settings and hyperparameters as (key, text) pairs; nested values as compact JSON."""
    out = []
    for key in sorted(mapping):
        value = mapping[key]
        text = (value if isinstance(value, str)
                else json.dumps(value, ensure_ascii=False, default=str))
        out.append((str(key), text))
    return out


# -- tables -----------------------------------------------------------------------------------


FIRST_USE_B = 10e6  # a first call that keeps this much more than the later ones is marked


def _api_extra(row: dict[str, Any], imported: dict[str, int]) -> dict[str, Any]:
    """imported: API → modules its first calls imported (`first_use`): detected, marked so."""
    written = row.get("written") or []
    memory = row.get("memory") or {}
    return {"written": written, "search": " ".join([row["api"], *written]).lower(),
            "first_use": first_use.mark(imported.get(row["api"], 0), memory)
            or _first_use(memory)}


def _first_use(memory: dict[str, Any]) -> str:
    """The mark of an API whose first call kept much more memory than its typical call:
    first-use work (modules imported on first use, caches, lazy initialisation), not the
    call's own state; "" otherwise."""
    first = _finite(memory.get("rss_first_call_delta_mean_B"))
    typical = _finite(memory.get("rss_delta_mean_B")) or 0.0
    if first is None or first < FIRST_USE_B:
        return ""
    if first == typical:  # one call per process: its only figure is its first use
        return (f"its only call kept {units.scaled(first, 'B')}: first-use work (modules "
                "imported on first use, caches) lands there, not only the call's own state")
    if first < 2 * max(typical, 0.0) + FIRST_USE_B:
        return ""
    return (f"the first call kept {units.scaled(first, 'B')}, later ones "
            f"{units.scaled(typical, 'B', signed=True)}: first-use work (modules imported on "
            "first use, caches, lazy initialisation)")


def _site_extra(row: dict[str, Any]) -> dict[str, Any]:
    loc = f"{row['file']}:{row.get('line', '')}" if row.get("file") else row["key"]
    text = " ".join(str(row.get(k) or "") for k in ("key", "api", "written", "function", "source"))
    return {"location": loc, "function": row.get("function") or "", "written": row.get("written"),
            "source": row.get("source") or "", "search": text.lower()}


def _table(name: str, columns: list[tables.Column], rows: list[dict[str, Any]],
           extra: Any, domains: list[dict[str, Any]]) -> dict[str, Any]:
    shown = rows[: tables.HTML_ROW_LIMIT]
    out_rows = []
    for r in shown:
        out_rows.append({"cells": [tables.cell(c, r) for c in columns],
                         "below_res": _below_resolution(r, domains),
                         "raised": r.get("raised", 0), **extra(r)})
    groups = tables.groups(columns)
    outside = _outside_calls_row(domains, "key" if name == "sites" else "api")
    return {"id": f"{name}-table", "name": name, "columns": columns, "groups": groups,
            "starts": {first for _, _, first in groups if first > 0},
            "rows": out_rows, "total": len(rows), "truncated": len(rows) > len(shown),
            "footer": [tables.cell(c, outside) for c in columns]}


def _outside_calls_row(domains: list[dict[str, Any]], label: str) -> dict[str, Any]:
    """The program's time between wrapped calls as a row of self figures: the last term of the
    self columns, whose shares with the rows' make 100 % (never shown below zero)."""
    energy = {}
    for d in domains:
        raw, sigma = d["outside_calls_J"], d.get("outside_calls_noise_J") or 0.0
        state = noise_floor.below_zero(raw, sigma)
        share = d.get("outside_calls_share")
        energy[d["domain"]] = {
            "self_J": noise_floor.shown(raw, sigma), "uncertainty_J": sigma,
            "below_zero": state,
            "share": share if state is None else (0.0 if state == noise_floor.WITHIN_NOISE
                                                  else None)}
    return {label: "(program outside calls)", "energy": energy}


def _below_resolution(row: dict[str, Any], domains: list[dict[str, Any]]) -> str:
    """The marker's explanation when most of a row's calls are shorter than a sensor's update
    period (their energy is apportioned inside sensor intervals), else ""."""
    parts = []
    for d in domains:
        share = tables.lookup(row, ("energy", d["domain"], "below_resolution_share"))
        if share is not None and share >= 0.5:
            parts.append(f"{domain_name(d['domain'])}: {units.percent(share)} of calls shorter "
                         f"than the sensor's {units.scaled(d.get('period_s'), 's')} update period")
    return "; ".join(parts)


def _intensities(a: RunAnalysis) -> list[dict[str, Any]]:
    out = []
    for d in a.domains:
        rec = a.intensities.get(d["domain"])
        if not rec:
            continue
        every = rec.get("apis") or {}
        apis = sorted(((k, v) for k, v in every.items() if v.get("identifiable", True)),
                      key=lambda kv: -kv[1]["intensity_W"])
        pooled = sorted(k for k, v in every.items() if not v.get("identifiable", True))
        rows = [{
            "api": name, "intensity": units.scaled(v["intensity_W"], "W"),
            "sigma": units.scaled(v["sigma_W"], "W") if math.isfinite(v["sigma_W"]) else "–",
            "busy": units.scaled(v["busy_s"], "s"), "distinct": v.get("distinct", False),
            "identifiable": v.get("identifiable", True), "capped": v.get("capped", False),
        } for name, v in apis[:MAX_INTENSITY_ROWS]]
        out.append({
            "domain": d["domain"], "name": domain_name(d["domain"]),
            "provenance": d["provenance"], "model": d.get("model"),
            "method": rec.get("method"), "asked": rec.get("asked"),
            "fell_back": rec.get("fell_back"), "supported": rec.get("supported"),
            "reason": rec.get("reason", ""),
            "pooled": units.scaled(rec.get("pooled_W"), "W"),
            "ceiling": units.scaled(rec.get("ceiling_W"), "W")
            if rec.get("ceiling_W") is not None else "none known",
            "intervals": rec.get("intervals"), "rows": rows,
            "more": max(0, len(apis) - MAX_INTENSITY_ROWS),
            "not_identifiable": pooled,
            "rest": units.scaled(every[pooled[0]]["intensity_W"], "W") if pooled else "",
        })
    return out


# -- charts -----------------------------------------------------------------------------------


def _replays(store: Store, a: RunAnalysis) -> dict[str, Any] | None:
    """The calibration replays on their own: each replayed site's power alone beside the fitted
    intensity of its API, and what was skipped and why (`fecomlite run --calibrate`)."""
    from fecomlite.analysis.calibration import replay_table

    result = store.result(a.run["id"], "calibration")
    if not result:
        return None
    rows = []
    for r in replay_table(a):
        for domain, e in sorted(r["energy"].items()):
            rows.append({
                "site": r["site"], "api": r["api"], "calls": r["calls"],
                "seconds": units.scaled(r["seconds"], "s"), "domain": domain,
                "provenance": e["provenance"], "model": e["model"],
                "power": units.scaled(e["power_W"], "W"),
                "fitted": units.scaled(e["fitted_W"], "W"),
                "sigma": units.scaled(e["fitted_sigma_W"], "W"),
            })
    skipped, notes = result.get("skipped") or [], result.get("notes") or []
    return {"rows": rows, "skipped": skipped, "notes": notes}


def _domain_series(a: RunAnalysis) -> list[dict[str, Any]]:
    return [{"key": d["domain"], "color": domain_color(d["domain"]), "provenance": d["provenance"],
             "label": f"{domain_name(d['domain'])} ({d['provenance']}"
                      + (f", {d['model']})" if d.get("model") else ")")}
            for d in a.domains]


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _bars_chart(a: RunAnalysis) -> dict[str, Any]:
    """APIs by their own (self) energy above idle, stacked over disjoint domains only (a share
    such as cpu-process is part of cpu-package and is never stacked on it): a call that wraps
    others does not count its children again, so with the program's time outside calls the
    bars add up to the program's above-idle energy."""
    keys = [d["domain"] for d in stacked_domains(a)]

    def own(row: dict[str, Any]) -> float:
        return sum(max(0.0, _finite(row["energy"][k]["self_J"]) or 0.0) for k in keys
                   if k in row["energy"])

    rows = sorted(a.apis, key=own, reverse=True)[:TOP_BARS]
    items = [{"label": r["api"], "note": f"{r['calls']:,} calls",
              "values": {k: _finite(r["energy"][k]["self_J"]) or 0.0 for k in keys
                         if k in r["energy"]}}
             for r in rows if own(r) > 0]
    by_name = {d["domain"]: d for d in a.domains}
    outside = {k: max(0.0, _finite(by_name[k]["outside_calls_J"]) or 0.0) for k in keys}
    if sum(outside.values()) > 0:
        items.append({"label": "(program outside calls)", "note": "between wrapped calls",
                      "values": outside})
    return {
        "type": "bars", "unit": "J",
        "series": [s for s in _domain_series(a) if s["key"] in keys],
        "items": items, "empty": "no API has energy above idle",
    }


def _memory_chart(a: RunAnalysis) -> dict[str, Any]:
    """APIs by how far their calls took memory above the level they started at (the most over
    their calls), beside what a call retains on average: each API's own memory, not the whole
    process's peak that every API shares."""
    keys = [("rss", "RSS", SERIES_COLORS[4])]
    if tables.has_gpu_memory(a.apis):
        keys.append(("gpu_mem", "GPU memory", SERIES_COLORS[5]))
    series, rank = [], []
    for key, name, color in keys:
        series.append({"key": f"{key}:above", "color": color,
                       "label": f"{name}: peak above the call's start (most over its calls)"})
        series.append({"key": f"{key}:retained", "color": shade(color, 1, 2),
                       "label": f"{name}: retained per call (mean)"})
    for r in a.apis:
        m = r["memory"]
        values = {}
        for key, _, _ in keys:
            above, kept = _finite(m.get(f"{key}_peak_above_start_max_B")), _finite(
                m.get(f"{key}_delta_mean_B"))
            if above is not None and above > 0:
                values[f"{key}:above"] = above
            if kept is not None and kept > 0:
                values[f"{key}:retained"] = kept
        if values:
            rank.append((max(values.values()), {"label": r["api"], "values": values,
                                                "note": f"{r['calls']:,} calls"}))
    rank.sort(key=lambda x: -x[0])
    return {"type": "bars", "mode": "grouped", "unit": "B", "series": series,
            "items": [item for _, item in rank[:TOP_BARS]], "totals": False,
            "empty": "no API raised memory above its starting level"}


def _scatter_chart(a: RunAnalysis) -> dict[str, Any]:
    points = []
    for r in a.apis:
        for d, e in r["energy"].items():
            y, x = _finite(e["per_call"]["mean"]), _finite(r["mean_time_s"])
            if x is None or y is None:
                continue
            points.append({"label": r["api"], "key": d, "x": x, "y": y,
                           "note": f"{r['calls']:,} calls"})
    return {"type": "scatter", "series": _domain_series(a), "points": points,
            "xUnit": "s", "yUnit": "J", "xName": "time per call",
            "yName": "energy per call above idle", "xLabel": "mean time per call",
            "yLabel": "mean energy per call, above idle"}


def _levels(a: RunAnalysis) -> dict[str, Any] | None:
    lv = a.levels
    if not lv or not lv.get("domains"):
        return None
    rows, items = [], []
    for d, v in lv["domains"].items():
        rows.append({"domain": d, "name": domain_name(d), "provenance": v.get("provenance"),
                     "project": units.scaled(v.get("project_J"), "J"),
                     "method": units.scaled(v.get("method_calls_J"), "J"),
                     "ratio": units.percent(v.get("ratio"))})
        items.append({"label": f"{domain_name(d)}: project-level total",
                      "values": {d: _finite(v.get("project_J")) or 0.0}})
        items.append({"label": f"{domain_name(d)}: method-level sum in calls",
                      "values": {d: _finite(v.get("method_calls_J")) or 0.0}})
    chart = {"type": "bars", "unit": "J", "series": _domain_series(a), "items": items}
    return {"project_run": lv.get("project_run"), "method_run": lv.get("method_run"),
            "rows": rows, "chart": chart}


def _datasize(result: Any) -> dict[str, Any] | None:
    """The data-size experiment's charts and fits, when the run has one (`datasize` result:
    {"target", "points": [{input_bytes, seconds, energy_J, peak_rss_B, ...}], "fits": {metric:
    {"linear": {intercept, slope, r2}, "power": {coefficient, exponent, r2}}}})."""
    if not isinstance(result, dict) or not result.get("points"):
        return None
    points = [p for p in result["points"] if _finite(p.get("input_bytes")) is not None]
    charts, fits = {}, []
    first = points[0] if points else {}
    provenance = result.get("provenance") or first.get("provenance")
    domain = result.get("domain") or first.get("domain")
    for metric, unit, label in DATASIZE_METRICS:
        if metric == "energy_J" and (provenance or domain):
            label += " (" + ", ".join(str(x) for x in (domain, provenance) if x) + ")"
        pts = [(float(p["input_bytes"]), _finite(p.get(metric))) for p in points]
        pts = [(x, y) for x, y in pts if y is not None]
        if not pts:
            continue
        xs = np.linspace(min(x for x, _ in pts), max(x for x, _ in pts), 40)
        fit = (result.get("fits") or {}).get(metric) or {}
        series = [{"label": "measured", "color": SERIES_COLORS[0], "markers": True,
                   "line": False, "points": [list(p) for p in sorted(pts)]}]
        if fit.get("linear"):
            f = fit["linear"]
            series.append({"label": f"linear fit (R² {f['r2']:.3f})", "color": SERIES_COLORS[1],
                           "dash": True, "points": [[x, f["intercept"] + f["slope"] * x]
                                                    for x in xs.tolist()]})
            fits.append({"metric": label, "kind": "linear", "r2": f"{f['r2']:.3f}",
                         "formula": f"{units.scaled(f['intercept'], unit)} + "
                                    f"{units.scaled(f['slope'], unit)} per byte"})
        if fit.get("power"):
            f = fit["power"]
            series.append({"label": f"power law (R² {f['r2']:.3f})", "color": SERIES_COLORS[2],
                           "dash": True, "points": [[x, f["coefficient"] * x ** f["exponent"]]
                                                    for x in xs.tolist() if x > 0]})
            fits.append({"metric": label, "kind": "power law", "r2": f"{f['r2']:.3f}",
                         "formula": f"{f['coefficient']:.3g} {unit} × bytes^"
                                    f"{units.sig3(f['exponent'])}"})
        charts[f"datasize-{metric}"] = {
            "type": "lines", "series": series, "xUnit": "B", "yUnit": unit,
            "xName": "input", "xLabel": "input size", "yLabel": label, "height": 220,
        }
    apis = datasize_api_rows(result)
    if not charts and not apis:
        return None
    return {"target": result.get("target", ""), "charts": charts,
            "keys": [{"key": k, "title": c["yLabel"]} for k, c in charts.items()],
            "fits": fits, "points": len(points), "apis": apis,
            "energy_label": ", ".join(str(x) for x in (domain, provenance) if x)}


def datasize_api_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each API's scaling with the fraction (`datasize.api_scaling`) as table rows: the mean
    calls per repetition at the smallest and the largest fraction, and every figure's exponent
    with its 95 % half-width and R²."""
    from fecomlite.analysis.datasize import API_METRICS, exponent_text

    rows = []
    for r in result.get("apis") or []:
        ends = [[p["calls"] for p in r["points"] if p["fraction"] == f]
                for f in (r["fractions"][0], r["fractions"][-1])]
        row = {"api": r["api"], "changes": r["changes"],
               "fractions": f"{r['fractions'][0]:g}–{r['fractions'][-1]:g}",
               "calls": " → ".join(f"{float(np.mean(c)):.4g}" for c in ends)}
        for metric, _, _ in API_METRICS:
            power = ((r["fits"].get(metric) or {}).get("power")) or {}
            row[f"{metric}_exponent"] = exponent_text(r, metric)
            row[f"{metric}_r2"] = f"{power['r2']:.2f}" if power else "–"
        rows.append(row)
    return rows


def datasize_csv(result: Any, run_mode: str) -> str | None:
    """One row per API and figure: the power law's exponent, its standard error and interval
    (and the run's `run_mode`, as in the other CSV files)."""
    if not isinstance(result, dict) or not result.get("apis"):
        return None
    from fecomlite.analysis.datasize import API_METRICS

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["api", "changes", "figure", "domain", "exponent", "exponent_se",
                     "exponent_ci95_low", "exponent_ci95_high", "r2", "points", "run_mode"])
    for r in result["apis"]:
        for metric, _, _ in API_METRICS:
            fit = r["fits"].get(metric) or {}
            power = fit.get("power") or {}
            ci = power.get("exponent_ci95") or [None, None]
            writer.writerow([r["api"], r["changes"], metric,
                             result.get("domain") if metric == "energy_J" else "",
                             power.get("exponent"), power.get("exponent_se"), *ci,
                             power.get("r2"), fit.get("points"), run_mode])
    return out.getvalue()


def _ended(code: int | None) -> str | None:
    """The badge of a program that did not exit 0: `exit 3`, `killed by SIGKILL`."""
    if not code:
        return None
    return f"exit {code}" if code > 0 else exit_description(code).removeprefix("was ")
