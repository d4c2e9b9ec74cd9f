"""A run's analysis: load it from the store, attribute energy per domain, aggregate per call site,
per API and per repetition. The CLI summary, the HTML report and JSON/CSV exports all read
`RunAnalysis` (`run_result`), so every figure has one definition.

This module walks one run through its parts, each in a module of its own: the sensors, their
baselines and how domains combine (`sensors_baseline`), the attribution of each domain's energy
to calls (`attribution`, `devices`), the program's figures per repetition (`program_figures`),
memory per call (`call_memory`), other load on the machine (`machine_load`) and the per-API and
per-site rows (`aggregate`). Its names are also the analysis' public face, re-exported here.

Per energy domain (cpu-package, dram, gpu:N, ...) one sensor is used, the best the run has: a
measured counter, else measured power, else an estimated power model. Its provenance and model
travel with every figure of that domain; domains are separate columns, and a sum across domains
is labelled `estimated` as soon as one part is.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import contention, pieces
from fecomlite.analysis.aggregate import (
    aggregate,
    below_zero_reasons,
    by_calls,
    cross_domain,
    grouped,
    lead_domain,
    mean_ci95,
    sort_key,
)
from fecomlite.analysis.calibration import fit_groups
from fecomlite.analysis.call_memory import (
    EMPTY_CALL_MEMORY,
    GPU_MEMORY_DOMAINS,
    RSS_SENSOR,
    below_gauge_resolution,
    call_memory,
    first_of_site,
    gauge_during,
)
from fecomlite.analysis.devices import (
    attribute_calls,
    device_masks,
    device_owners,
    domain_calls,
)
from fecomlite.analysis.machine_load import machine_load
from fecomlite.analysis.placed import Placed
from fecomlite.analysis.program_figures import (
    OUTSIDE_CALLS,
    calls_only,
    domain_row,
    intensity_record,
    per_rep_rows,
    rep_call_figures,
    rep_spans,
    rep_window_energy,
    with_program_gaps,
)
from fecomlite.analysis.run_mode import run_mode
from fecomlite.analysis.run_result import RunAnalysis
from fecomlite.analysis.run_tables import plain
from fecomlite.analysis.sensors_baseline import (
    ADDITIVE_DOMAINS,
    BUSY_SHARE,
    CPU_BUSY_MEANS,
    HOST_DOMAINS,
    busy_at,
    ceiling_W,
    choose_energy_sensors,
    domain_role,
    finite_or_zero,
    idle_baseline,
    read_samples,
    reliable_when,
    sensor_rows,
    share_notes,
)
from fecomlite.runtime.batch_codec import PROJECT_SITE
from fecomlite.runtime.calibration_replay import KIND as CALIBRATION_KIND
from fecomlite.store import Store
from fecomlite.store.reads import dense_ranks, row_codes

STREAM_ABOVE = 1_000_000  # calls: a longer run is analysed streamed, in bounded memory

__all__ = [  # what the rest of fecomlite imports from here
    "ADDITIVE_DOMAINS", "BUSY_SHARE", "CPU_BUSY_MEANS", "GPU_MEMORY_DOMAINS", "HOST_DOMAINS",
    "RSS_SENSOR", "RunAnalysis", "analyse_run", "below_gauge_resolution",
    "busy_at", "choose_energy_sensors", "cross_domain", "domain_role", "finite_or_zero",
    "gauge_during", "idle_baseline", "lead_domain", "machine_load", "mean_ci95",
    "reliable_when",
]


@dataclass
class _Calls:
    """A run's calls as the attribution needs them: `RunAnalysis.calls`' columns, each call's
    site, API and fit group (a calibration replay shares its API's), thread and nesting."""

    columns: dict[str, Any]
    sites: list[dict[str, Any]]
    api_names: list[str]
    api_of_site: np.ndarray
    fit_names: list[str]
    fit_of_api: np.ndarray
    thread: np.ndarray
    replay: np.ndarray


def _events(store: Store, run_id: int) -> dict[str, np.ndarray]:
    cols = store.event_columns(run_id)  # numpy columns: no Python object per call
    out = {c: cols[c] for c in ("rep", "site_id", "pid", "tid", "t_start_ns", "t_end_ns",
                                "status")}
    for c in ("in_bytes", "out_bytes"):
        out[c] = cols[c].astype(float)
        out[c][cols[c] < 0] = np.nan  # not taken
    return out


def _program_on_main_thread(ev: dict[str, np.ndarray], program: np.ndarray) -> np.ndarray:
    """Thread ids with each project-level `<program>` event moved onto its process's main thread.

    The server stores that event with thread 0; left there it would count as a second thread
    running beside the calls the program records itself (regions, a sweep's training), and
    overlap would give them only half of their intervals. The main thread is the one of the
    process's first other event in that repetition (the script's own thread)."""
    tid = ev["tid"].copy()
    for i in np.flatnonzero(program):
        inside = ~program & (ev["pid"] == ev["pid"][i]) & (ev["rep"] == ev["rep"][i])
        if inside.any():  # events are in start order: the first is the main thread's
            tid[i] = ev["tid"][np.flatnonzero(inside)[0]]
    return tid


def _threads(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """One small integer per (pid, tid), in their order."""
    return dense_ranks(row_codes(pid, tid))[1]


def _load_calls(store: Store, run_id: int) -> _Calls:
    sites = store.sites(run_id)
    ev = _events(store, run_id)
    t0, t1 = ev["t_start_ns"], ev["t_end_ns"]
    n = t0.size
    site_of = np.searchsorted(np.array([s["id"] for s in sites], dtype=np.int64), ev["site_id"])
    api_names = sorted({s["api"] for s in sites})
    api_index = {a: i for i, a in enumerate(api_names)}
    api_of_site = np.array([api_index[s["api"]] for s in sites], dtype=np.int64)
    api_of = api_of_site[site_of] if n else np.zeros(0, np.int64)
    # a calibration replay (API `calibrate:<api>`) has its own rows but shares <api>'s intensity
    fit_names, fit_index = fit_groups(api_names)

    def per_call(flags: list[bool]) -> np.ndarray:
        return np.array(flags, bool)[site_of] if n else np.zeros(0, bool)

    program = per_call([s["api"] == PROJECT_SITE for s in sites])
    thread = _threads(ev["pid"], _program_on_main_thread(ev, program))
    parent, depth = at.nesting(t0, t1, thread)
    columns: dict[str, Any] = {
        "site": site_of, "api": api_of, **ev, "duration_s": (t1 - t0) / at.NS,
        "parent": parent, "depth": depth,
        "call": pieces.call_heads(ev["rep"], ev["pid"], ev["tid"], site_of, t0, ev["status"]),
        "energy_J": {}, "energy_total_J": {}, "self_energy_J": {}, "uncertainty_J": {},
        "below_resolution": {},
    }
    return _Calls(columns, sites, api_names, api_of_site, fit_names,
                  np.array(fit_index, dtype=np.int64), thread,
                  per_call([s["kind"] == CALIBRATION_KIND for s in sites]))


@dataclass
class _Domains:
    """What the attribution of every energy domain gives: one row per domain (`RunAnalysis`),
    each domain's attribution, energy per repetition and fitted intensities; notes on the
    sensors passed over; the methods used."""

    rows: list[dict[str, Any]]
    results: dict[str, at.Attribution]
    rep_energy: dict[str, list[dict[str, float]]]
    intensities: dict[str, Any]
    notes: list[str]
    methods: set[str]


def _attribute_domains(
    store: Store, run_id: int, run: dict[str, Any], reps: list[dict[str, Any]],
    chosen: dict[str, dict[str, Any]], calls: _Calls, method: str,
) -> _Domains:
    """Each chosen sensor's energy above idle shared among the calls (`attribution`); the
    host's domains with the program's time between calls as one more activity, a device's with
    its own processes' calls only (`devices`)."""
    cols = calls.columns
    t0, t1 = cols["t_start_ns"], cols["t_end_ns"]
    details = store.result(run_id, "sensors") or {}
    baseline = store.result(run_id, "idle_baseline") or {}
    out = _Domains([], {}, {}, {}, [], set())
    windows = rep_spans(reps, (int(t0.min()), int(t1.max())) if t0.size else None)
    on_device = device_masks(device_owners(store.processes(run_id)), cols["pid"])
    fit_of = calls.fit_of_api[cols["api"]]
    host = with_program_gaps(t0, t1, calls.thread, fit_of, len(calls.fit_names), reps,
                             t0[calls.replay], (cols["parent"], cols["depth"]))
    leaves: dict[bytes, Any] = {}  # what sensors read at the same instants share
    for domain, sensor in sorted(chosen.items()):
        t, v = read_samples(store, sensor["id"])
        try:
            iv = at.sensor_intervals(sensor["kind"], t, v, period_s=sensor.get("period_s"))
        except ValueError as exc:
            out.notes.append(f"{domain}: {sensor['name']} skipped: {exc}")
            continue
        if iv.count == 0:
            out.notes.append(f"{domain}: {sensor['name']} has too few updates to attribute")
            continue
        idle, idle_source = idle_baseline(run, sensor)
        if idle is None:
            idle = at.estimate_idle_W(iv, t0, t1)
            idle_source = "estimated from quiet intervals (no baseline stored)"
        activities = calls.fit_names
        ceiling = ceiling_W(sensor, details, v, idle)
        if domain in HOST_DOMAINS and host is not None:
            leaf, placed = _shared_leaf(leaves, iv.edges_ns, host)
            res = calls_only(at.attribute(iv, method=method, idle_W=idle, ceiling_W=ceiling,
                                          leaf=leaf, placed=placed, **host), t0.size)
            activities = [*calls.fit_names, OUTSIDE_CALLS]
        else:  # a GPU's (a merged node's) energy to its processes' calls: distributed runs
            res = attribute_calls(
                iv, domain_calls(on_device, domain), t0, t1, idle_W=idle, thread=calls.thread,
                group=fit_of, method=method, ngroups=max(len(calls.fit_names), 1),
                nest=(cols["parent"], cols["depth"]), ceiling_W=ceiling,
            )
        out.methods.add(res.method)
        out.results[domain] = res
        for key in ("energy_J", "energy_total_J", "self_energy_J", "uncertainty_J",
                    "below_resolution"):
            cols[key][domain] = getattr(res, key)
        out.rep_energy[domain] = rep_window_energy(iv, idle, reps)
        out.rows.append(domain_row(sensor, iv, (idle, idle_source), ceiling, res, reps,
                                   out.rep_energy[domain], baseline, windows))
        out.intensities[domain] = intensity_record(res, activities, method)
    return out


def _shared_leaf(leaves: dict[bytes, tuple[np.ndarray, Placed]], edges: np.ndarray,
                 host: dict[str, Any]) -> tuple[np.ndarray, Placed]:
    """`attribution.leaf_time` of the host's activities over `edges`, and where they fall among
    them (`Placed`): found once for every sensor read at those instants (a CPU and DRAM model,
    RAPL's domains)."""
    key = edges.tobytes()
    if key not in leaves:
        t0 = np.asarray(host["t_start_ns"], np.int64)
        t1 = np.maximum(np.asarray(host["t_end_ns"], np.int64), t0)
        placed = Placed.of(edges, t0, t1)
        leaves[key] = (at.leaf_time(edges, t0, t1, np.asarray(host["group"], np.int64),
                                    host["nest"][0], host["ngroups"], placed), placed)
    return leaves[key]


def _add_noise_figures(domains: list[dict[str, Any]], reps: list[dict[str, Any]]) -> None:
    """The idle baseline's spread over the program's time; and the sensor's resolution: the
    intervals cut by each repetition's start and end go to calls or not by their overlap."""
    for d in domains:
        d["noise_J"] = d["idle_sigma_W"] * d["program_s"]
        d["tail_noise_J"] = d["idle_sigma_W"] * d["tail_s"]
        d["other_noise_J"] = d["idle_sigma_W"] * max(
            d["recording_s"] - d["program_s"] - d["tail_s"], 0.0)
        d["above_noise_J"] = d["idle_sigma_W"] * d["recording_s"]
        rate = abs(d["program_J"]) / d["program_s"] if d["program_s"] > 0 else 0.0
        d["resolution_J"] = 2 * max(len(reps), 1) * finite_or_zero(d["period_s"]) * rate
        d["outside_calls_noise_J"] = math.hypot(finite_or_zero(d["noise_J"]), d["resolution_J"])


def _mark_load(domains: list[dict[str, Any]], load: dict[str, Any]) -> None:
    """A domain other processes loaded is unreliable, with the reason; what load did to it, with
    the size (`contention`): marked, not hidden."""
    for d in domains:
        busy = d["domain"] in load["busy_domains"] and d["role"] != "share"
        d["unreliable"] = [load["busy_domains"][d["domain"]]] if busy else []
        d["reliable"] = not busy
        d["load_effect"] = contention.effects(load["contention"], d["domain"])
        d["load_distortion"] = load["contention"]["distortion"] if d["load_effect"] else None


@dataclass
class _Part:
    """What the whole-run or the streamed path gives the rest of the analysis: the calls'
    columns (empty when streamed), the domains attributed, per-repetition events and energy in
    calls, the sites and APIs, and how to make their raw rows (`aggregate`'s) once the domains'
    noise is known."""

    columns: dict[str, Any]
    found: _Domains
    rep_events: list[int]
    rep_in_calls: dict[str, list[float]]
    sites: list[dict[str, Any]]
    api_names: list[str]
    api_of_site: np.ndarray
    raw_rows: Callable[[dict[str, dict[str, Any]], dict[str, float]],
                       tuple[list[dict[str, Any]], list[dict[str, Any]]]]
    memory_sensors: dict[str, str]


def _whole_part(store: Store, run_id: int, run: dict[str, Any], reps: list[dict[str, Any]],
                chosen: dict[str, dict[str, Any]], method: str) -> _Part:
    """Every call's columns in memory: per-call figures (memory, medians, timelines) too."""
    calls = _load_calls(store, run_id)
    cols = calls.columns
    found = _attribute_domains(store, run_id, run, reps, chosen, calls, method)
    memory, memory_sensors = call_memory(store, store.sensors(run_id), cols["t_start_ns"],
                                         cols["t_end_ns"])
    cols.update(memory)
    cols["first_use"] = first_of_site(cols["rep"], cols["pid"], cols["site"], cols["status"])

    def raw_rows(dom_info: dict[str, dict[str, Any]], above: dict[str, float]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        g = grouped(cols, {d: found.results[d] for d in dom_info}, calls.api_of_site)
        site_fit = calls.fit_of_api[calls.api_of_site]
        sites = aggregate(g, g.sites, dom_info, above, reps, found.results, site_fit)
        return sites, aggregate(g, g.apis, dom_info, above, reps, found.results,
                                calls.fit_of_api, same=by_calls(g.sites, site_fit, sites))

    return _Part(cols, found, *rep_call_figures(cols, reps, list(found.rep_energy)),
                 calls.sites, calls.api_names, calls.api_of_site, raw_rows, memory_sensors)


def stream_limit() -> int:
    """Calls above which a run is analysed streamed: STREAM_ABOVE, or the environment's
    FECOMLITE_STREAM_ABOVE (0: always)."""
    value = os.environ.get("FECOMLITE_STREAM_ABOVE", "")
    return int(value) if value.strip().isdigit() else STREAM_ABOVE


def _streamable(store: Store, run_id: int) -> bool:
    """`streamed_run.streamable`, its modules loaded only for a run that may be analysed
    streamed (not for the whole-run path, a report's most common)."""
    from fecomlite.analysis.streamed_run import streamable

    return streamable(store, run_id)


def _streamed_part(store: Store, run_id: int, run: dict[str, Any], reps: list[dict[str, Any]],
                   method: str, limit: int, detail: _Part | None = None) -> _Part:
    """The run's chunks swept twice (`streamed_run`): memory that does not grow with the run;
    no per-call columns, so no per-call median or timeline of calls, except those of a
    bounded-storage run's calls kept in detail (`detail`: `_whole_part` of those alone)."""
    from fecomlite.analysis.call_buckets import mark_bucketed
    from fecomlite.analysis.streamed_run import analyse_streamed, group_rows

    got = analyse_streamed(store, run_id, method)
    found = _Domains(got.domains, {}, {}, {}, got.notes, {d.method for d in got.dom.values()})
    for domain, dom in got.dom.items():
        found.rep_energy[domain] = rep_window_energy(dom.iv, dom.idle_W, reps)
        activities = [*got.fit_names, OUTSIDE_CALLS] if dom.gaps else got.fit_names
        found.intensities[domain] = intensity_record(dom, activities, method)  # type: ignore[arg-type]
    n_sites = len(got.sites)
    calls = int(got.sums.calls.sum())
    why = "its calls past the detail window are in buckets" if got.folded else (
        f"above {limit:,} calls")
    kept = int(detail.columns["call"].size) if detail is not None else 0
    found.notes.append(
        f"{calls:,} calls: analysed streamed over the stored chunks, in memory that does not "
        f"grow with the run ({why}); " + (
            f"per-call medians, the calls' timeline and layer contexts are those of the "
            f"{kept:,} calls kept in detail (the first and the latest window of each "
            "repetition)" if detail is not None else "figures that need every call at once "
            "are not shown: per-call medians, the calls' timeline and layer contexts"))

    def raw_rows(dom_info: dict[str, dict[str, Any]], above: dict[str, float]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rows = (group_rows(got, np.arange(n_sites), n_sites, got.site_fit, dom_info, above),
                group_rows(got, got.api_of_site, len(got.api_names), got.fit_of_api, dom_info,
                           above))
        if got.folded is not None:
            mark_bucketed(rows, got.folded, got.api_of_site, len(got.api_names))
        if detail is not None and set(dom_info) <= set(detail.found.results):
            _detail_medians(rows, detail.raw_rows(dom_info, above))
        return rows

    return _Part(_empty_columns(list(got.dom)), found, got.rep_events, got.rep_in_calls,
                 got.sites, got.api_names, got.api_of_site, raw_rows, got.memory_sensors)


def _detail_medians(rows: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                    detail: tuple[list[dict[str, Any]], list[dict[str, Any]]]) -> None:
    """The per-call medians of the calls kept in detail into the streamed rows (same site and
    API order), with how many calls each is of (`median_calls`)."""
    for streamed_rows, detail_rows in zip(rows, detail, strict=True):
        for row, mine in zip(streamed_rows, detail_rows, strict=True):
            row["median_calls"] = mine["calls"]
            for domain, e in row["energy"].items():
                e["per_call"]["median"] = mine["energy"][domain]["per_call"]["median"]


def _empty_columns(domains: list[str]) -> dict[str, Any]:
    """`RunAnalysis.calls` without a call (a streamed run keeps none)."""
    ints = ("rep", "site", "api", "site_id", "pid", "tid", "t_start_ns", "t_end_ns", "status",
            "parent", "depth", "call")
    cols: dict[str, Any] = {c: np.zeros(0, np.int64) for c in ints}
    cols.update({c: np.zeros(0) for c in ("in_bytes", "out_bytes", "duration_s")})
    for key in ("energy_J", "energy_total_J", "self_energy_J", "uncertainty_J"):
        cols[key] = {d: np.zeros(0) for d in domains}
    cols["below_resolution"] = {d: np.zeros(0, bool) for d in domains}
    cols.update({k: np.zeros(0, v.dtype) for k, v in EMPTY_CALL_MEMORY.items()})
    return cols


def _group_rows(
    part: _Part, domains: list[dict[str, Any]], above: dict[str, float],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(site rows, API rows) of the groups that were called, most costly first (`aggregate`);
    a domain where some fell below zero beyond noise is flagged unreliable."""
    sites = part.sites
    site_rows, api_rows = part.raw_rows({d["domain"]: d for d in domains}, above)
    for row, s in zip(site_rows, sites, strict=True):
        row.update({k: s[k] for k in ("key", "file", "line", "col", "api", "written", "kind",
                                      "function", "source")})
    for i, row in enumerate(api_rows):
        row["api"] = part.api_names[i]
        members = [s for s, a in zip(sites, part.api_of_site, strict=True) if a == i]
        row["written"] = sorted({s["written"] for s in members if s["written"]})
        row["sites"] = len(members)
    site_rows = [r for r in site_rows if r["calls"]]
    api_rows = [r for r in api_rows if r["calls"]]
    flagged = below_zero_reasons(domains, api_rows, "APIs", "api")
    below_zero_reasons(domains, site_rows, "call sites", "key", skip=flagged)
    order_key = sort_key(domains)
    site_rows.sort(key=order_key, reverse=True)
    api_rows.sort(key=order_key, reverse=True)
    return site_rows, api_rows


def analyse_run(
    store: Store, run_id: int, method: str = "auto", *, compare_levels: bool = True,
    stream_above: int | None = None,
) -> RunAnalysis:
    """Attribute every energy domain of run `run_id` and aggregate; stores the intensities. A
    run of more than `stream_above` calls (default `stream_limit`) is analysed streamed."""
    if method not in at.METHODS:
        raise ValueError(f"method must be one of {at.METHODS}, not {method!r}")
    run = store.run(run_id)
    reps = store.repetitions(run_id)
    sensors = store.sensors(run_id)
    details = store.result(run_id, "sensors") or {}
    chosen, notes = choose_energy_sensors(sensors, details)
    limit = stream_limit() if stream_above is None else stream_above
    with store.snapshot():  # one moment of a run still recording (and folding)
        folded = store.folded_calls(run_id) > 0  # `--keep`: the streamed analysis reads them
        stored = store.event_count(run_id)
        if (folded or stored > limit) and _streamable(store, run_id):
            detail = (_whole_part(store, run_id, run, reps, chosen, method)
                      if folded and 0 < stored <= limit else None)
            part = _streamed_part(store, run_id, run, reps, method, limit, detail)
        else:
            part = detail = _whole_part(store, run_id, run, reps, chosen, method)
    found = part.found
    notes += found.notes
    if folded and not _streamable(store, run_id):
        notes.append(f"{store.folded_calls(run_id):,} calls past the detail window (--keep) are "
                     "in buckets, which the analysis of a distributed job does not read: its "
                     "figures cover the calls kept in detail only")
    domains = found.rows
    if found.intensities and not store.readonly:  # a report reads the store, never writes it
        store.put_result(run_id, "intensities", plain(found.intensities))
    _add_noise_figures(domains, reps)
    notes += share_notes(domains)
    load = machine_load(store, sensors, store.result(run_id, "idle_baseline") or {}, reps)
    _mark_load(domains, load)
    above = {d["domain"]: d["program_J"] if d["program_J"] > finite_or_zero(d["noise_J"])
             else math.nan for d in domains}
    site_rows, api_rows = _group_rows(part, domains, above)
    for d in domains:  # the last row of the self shares: with the APIs' they make 100 %
        d["outside_calls_share"] = d["outside_calls_J"] / above[d["domain"]]
    if part.memory_sensors:
        notes.append("memory from " + "; ".join(
            f"{k}: {v}" for k, v in part.memory_sensors.items()))
    analysis = RunAnalysis(
        run=run, repetitions=reps, sensors=sensor_rows(sensors, details, chosen),
        domains=domains, calls=part.columns, sites=site_rows, apis=api_rows,
        per_rep=per_rep_rows(reps, part.rep_events, part.rep_in_calls,
                             {d["domain"]: d for d in domains}, found.rep_energy),
        share_in_calls={d["domain"]: d["in_calls_J"] / above[d["domain"]] for d in domains},
        intensities=found.intensities,
        method="+".join(sorted(found.methods)) or "none", notes=notes,
        site_keys=[s["key"] for s in part.sites], api_names=part.api_names, load=load,
        mode=run_mode(run.get("settings") or {}),
        detail_calls=detail.columns if detail is not None and detail is not part else None,
    )
    if compare_levels:
        analysis.levels = _compare_levels(store, run, analysis, method)
    return analysis


def _compare_levels(
    store: Store, run: dict[str, Any], analysis: RunAnalysis, method: str
) -> dict[str, Any] | None:
    """Method-level sum in calls against the project-level total, per domain, per repetition
    mean, when this run is project level and a method-level run of the same program exists."""
    if run.get("level") != "project":
        return None
    sibling = store.latest_method_run(run["program"], other_than=run["id"])
    if sibling is None:
        return None
    other = analyse_run(store, int(sibling), method, compare_levels=False)
    out: dict[str, Any] = {"project_run": run["id"], "method_run": int(sibling), "domains": {}}
    for d in analysis.domains:
        name = d["domain"]
        proj = [r["energy"][name].get("above_idle_J", math.nan) for r in analysis.per_rep]
        meth = [r["energy"].get(name, {}).get("in_calls_J", math.nan) for r in other.per_rep]
        p, m = float(np.nanmean(proj)) if proj else math.nan, (
            float(np.nanmean(meth)) if meth else math.nan)
        out["domains"][name] = {
            "project_J": p, "method_calls_J": m, "ratio": m / p if p else math.nan,
            "provenance": d["provenance"],
        }
    return out
