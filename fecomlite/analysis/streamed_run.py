"""A run's per-domain, per-site and per-API figures from the streamed attribution (`streamed`),
in the shapes `analyse_run` gives them (`RunAnalysis.domains`' attribution figures, `aggregate`'s
rows), read from the store one batch of chunks at a time.

What it leaves out, and why: the per-call median (it does not merge over chunks; a bounded
sample would be needed); a distributed job is analysed whole (`streamable`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import call_buckets, streamed, sweep
from fecomlite.analysis.aggregate import cross_domain, floor_at_zero, mean_ci95
from fecomlite.analysis.calibration import fit_groups
from fecomlite.analysis.distributions import t_quantile
from fecomlite.analysis.program_figures import domain_row, rep_spans, rep_window_energy
from fecomlite.analysis.sensors_baseline import (
    HOST_DOMAINS,
    ceiling_W,
    choose_energy_sensors,
    finite_or_zero,
    idle_baseline,
    read_samples,
)
from fecomlite.analysis.streamed_memory import MemorySums, read_gauges
from fecomlite.runtime.batch_codec import PROJECT_SITE
from fecomlite.runtime.calibration_replay import KIND as CALIBRATION_KIND
from fecomlite.store import Store


def streamable(store: Store, run_id: int) -> bool:
    """Whether the run can be analysed streamed: not a distributed job (its GPUs' energy goes to
    their own processes' calls only, `devices`, and its per-rank figures read every call)."""
    return not store.processes(run_id)


def _site_ids(store: Store, run_id: int, sites: list[dict[str, Any]], kinds: set[str],
              apis: set[str]) -> list[int]:
    return [s["id"] for s in sites if s["kind"] in kinds or s["api"] in apis]


def _first_pass_facts(store: Store, run_id: int, sites: list[dict[str, Any]]
                      ) -> tuple[dict[tuple[int, int], int], dict[int, int]]:
    """({(rep, pid): main thread} for a project-level `<program>` event, {rep: first replay
    start}): read only when the run has such sites."""
    program = _site_ids(store, run_id, sites, set(), {PROJECT_SITE})
    replays = _site_ids(store, run_id, sites, {CALIBRATION_KIND}, set())
    first_replay: dict[int, int] = {}
    if not program and not replays:
        return {}, first_replay
    earliest: dict[tuple[int, int], tuple[int, int]] = {}  # (rep, pid): (start, tid)
    for cols in store.event_chunks(run_id):  # a chunk is one process's, in one repetition
        key = (int(cols["rep"][0]), int(cols["pid"][0]))
        others = np.flatnonzero(~np.isin(cols["site_id"], program))
        if others.size:  # the process's first other event: its main thread
            first = (int(cols["t_start_ns"][others[0]]), int(cols["tid"][others[0]]))
            earliest[key] = min(earliest.get(key, first), first)
        mine = np.isin(cols["site_id"], replays)
        if mine.any():
            start = int(cols["t_start_ns"][mine].min())
            first_replay[key[0]] = min(first_replay.get(key[0], start), start)
    return {key: tid for key, (_, tid) in earliest.items()}, first_replay


def _windows(reps: list[dict[str, Any]], first_replay: dict[int, int]) -> streamed.Windows:
    spans = {}
    for r in reps:
        a, b = r.get("t_start_ns"), r.get("t_end_ns")
        if a is None or b is None:
            continue
        start = first_replay.get(r["rep"])
        end = start if start is not None and a <= start <= b else b
        spans[int(r["rep"])] = (int(a), int(end))
    return streamed.Windows(spans)


@dataclass
class StreamedRun:
    """The attribution's figures of a run without its calls: domain rows (`domain_row`), the
    per-site sums (energy, `streamed.SiteSums`; memory, `MemorySums`, and the gauges it read),
    the domains as the sweeps saw them (fit, method), per repetition its events
    and energy in calls; sites (the store's rows) with their API, fit group; notes."""

    domains: list[dict[str, Any]]
    sums: streamed.SiteSums
    memory: MemorySums
    memory_sensors: dict[str, str]
    dom: dict[str, streamed.Domain]
    rep_ids: list[int]
    rep_events: list[int]
    rep_in_calls: dict[str, list[float]]
    sites: list[dict[str, Any]]
    api_names: list[str]
    api_of_site: np.ndarray
    fit_names: list[str]
    fit_of_api: np.ndarray
    site_fit: np.ndarray
    notes: list[str]
    folded: call_buckets.FoldedCalls | None = None  # `--keep`'s buckets, None without


def analyse_streamed(store: Store, run_id: int, method: str = "auto",
                     batch_events: int = sweep.BATCH_EVENTS) -> StreamedRun:
    """The attribution's figures of run `run_id` without holding its calls (`streamed`)."""
    if method not in at.METHODS:
        raise ValueError(f"method must be one of {at.METHODS}, not {method!r}")
    run, reps = store.run(run_id), store.repetitions(run_id)
    sensors, details = store.sensors(run_id), store.result(run_id, "sensors") or {}
    sites = store.sites(run_id)
    site_ids = np.array([s["id"] for s in sites], np.int64)
    api_names = sorted({s["api"] for s in sites})
    api_index = {a: i for i, a in enumerate(api_names)}
    api_of_site = np.array([api_index[s["api"]] for s in sites], np.int64)
    fit_names, fit_index = fit_groups(api_names)
    fit_of_api = np.array(fit_index, np.int64)
    site_fit = fit_of_api[api_of_site] if sites else np.zeros(0, np.int64)
    stored = store.event_count(run_id)  # a running run's chunks keep coming: see below
    main, first_replay = _first_pass_facts(store, run_id, sites)
    program = _site_ids(store, run_id, sites, set(), {PROJECT_SITE})

    def chunks() -> Any:
        return store.event_chunks(run_id)

    def threads() -> sweep.Threads:
        return sweep.Threads(program, main)

    table = np.zeros(int(site_ids.max()) + 1 if site_ids.size else 0, np.int64)
    table[site_ids] = np.arange(site_ids.size)  # store ids are small: a lookup, not a search

    def site_index(ids: np.ndarray) -> np.ndarray:
        return table[ids] if table.size < 1 << 24 else np.searchsorted(site_ids, ids)

    chosen, notes = choose_energy_sensors(sensors, details)
    domains, sensor_of = _plan_domains(store, run, chosen, details, len(fit_names), notes)
    windows = _windows(reps, first_replay)
    span = streamed.sweep_one(chunks, threads(), site_fit, site_index, domains, windows,
                              batch_events)
    folded = _folded_time(store, run_id, site_index, site_fit, domains)
    for domain, dom in domains.items():  # an idle level estimated in sweep 1 sets the ceiling
        if idle_baseline(run, sensor_of[domain])[0] is None:
            t, v = read_samples(store, sensor_of[domain]["id"])
            dom.ceiling_W = ceiling_W(sensor_of[domain], details, v, dom.idle_W)
    rates = streamed.rates_of(domains, method)
    rep_ids = [r["rep"] for r in reps] or _reps_seen(store, run_id)
    gauges, gauges_used = read_gauges(store, sensors)
    memory = MemorySums(gauges, len(sites))
    sums, extra = streamed.sweep_two(chunks, threads(), site_fit, site_index, domains, rates,
                                     rep_ids, memory, batch_events)
    if folded is not None:
        notes.append(folded.note(int(sums.calls.sum())))
        folded.add_energy(sums, extra, domains, rates, rep_ids)
    baseline = store.result(run_id, "idle_baseline") or {}
    domain_rows = [_domain_row(run, reps, dom, sensor_of[d], rates[d], {
        **extra["totals"][d], "self_J": float(sums.energy[d]["self"].sum())}, baseline, span)
        for d, dom in domains.items()]
    note = streamed.pieces_note(extra["pieces"])
    if store.event_count(run_id) != stored:
        notes.append("the run was still recording: calls stored while it was analysed may be "
                     "counted in part (the two sweeps over its chunks read what was stored by "
                     "then); report it again once it has finished")
    return StreamedRun(domain_rows, sums, memory, gauges_used, domains, rep_ids,
                       extra["rep_events"], extra["rep_in_calls"], sites, api_names,
                       api_of_site, fit_names, fit_of_api, site_fit,
                       notes + ([note] if note else []), folded)


def _folded_time(store: Store, run_id: int, site_index: Any, site_fit: np.ndarray,
                 domains: dict[str, streamed.Domain]) -> call_buckets.FoldedCalls | None:
    """The calls `--keep` folded into buckets (`call_buckets`), their time added to each
    domain's before the fit; None for a run kept call by call."""
    folded = call_buckets.read(store, run_id, site_index, site_fit)
    if folded is not None:
        folded.add_time(domains)
    return folded


def _plan_domains(
    store: Store, run: dict[str, Any], chosen: dict[str, dict[str, Any]],
    details: dict[str, Any], n_fit: int, notes: list[str],
) -> tuple[dict[str, streamed.Domain], dict[str, dict[str, Any]]]:
    """({domain: `streamed.Domain`}, {domain: its sensor}) of the chosen sensors that can be
    attributed (those that cannot get a note, as in `analyse_run`)."""
    domains: dict[str, streamed.Domain] = {}
    sensor_of: dict[str, dict[str, Any]] = {}
    for domain, sensor in sorted(chosen.items()):
        t, v = read_samples(store, sensor["id"])
        try:
            iv = at.sensor_intervals(sensor["kind"], t, v, period_s=sensor.get("period_s"))
        except ValueError as exc:
            notes.append(f"{domain}: {sensor['name']} skipped: {exc}")
            continue
        if iv.count == 0:
            notes.append(f"{domain}: {sensor['name']} has too few updates to attribute")
            continue
        idle, _ = idle_baseline(run, sensor)
        ceiling = ceiling_W(sensor, details, v, idle if idle is not None else 0.0)
        domains[domain] = streamed.Domain(domain, iv, idle, ceiling, domain in HOST_DOMAINS,
                                          max(n_fit, 1))
        sensor_of[domain] = sensor
    return domains, sensor_of


def _domain_row(run: dict[str, Any], reps: list[dict[str, Any]], dom: streamed.Domain,
                sensor: dict[str, Any], rates: streamed.Rates, totals: dict[str, float],
                baseline: dict[str, Any], span: tuple[int, int] | None) -> dict[str, Any]:
    """`program_figures.domain_row` from the sweeps' figures of one domain."""
    measured = idle_baseline(run, sensor)
    idle_source = measured[1] if measured[0] is not None else (
        "estimated from quiet intervals (no baseline stored)")
    res = SimpleNamespace(**streamed.run_totals(dom, rates, totals), method=dom.method,
                          fell_back=dom.fell_back)
    return domain_row(sensor, dom.iv, (dom.idle_W, idle_source), dom.ceiling_W, res, reps,
                      rep_window_energy(dom.iv, dom.idle_W, reps), baseline,
                      rep_spans(reps, span))


def _reps_seen(store: Store, run_id: int) -> list[int]:
    seen: set[int] = set()
    for cols in store.event_chunks(run_id):
        seen.update(np.unique(cols["rep"]).tolist())
    return sorted(seen)


def group_rows(result: StreamedRun, group_of_site: np.ndarray, ngroups: int,
               fit_of_group: np.ndarray, domain_info: dict[str, dict[str, Any]],
               above: dict[str, float]) -> list[dict[str, Any]]:
    """`aggregate.aggregate`'s rows from the streamed per-site sums: the sites of each group
    merged (sums add, per-call moments merge); no per-call median."""
    sums = result.sums
    rows = []
    for g in range(ngroups):
        members = np.flatnonzero(group_of_site == g)
        calls = int(sums.calls[members].sum())
        total_s = float(sums.time_s[members].sum())
        row: dict[str, Any] = {
            "calls": calls, "raised": int(sums.raised[members].sum()), "total_time_s": total_s,
            "mean_time_s": total_s / calls if calls else math.nan,
            "per_rep_calls": [int(v) for v in sums.rep_calls[members].sum(axis=0)],
            "energy": {}, "memory": result.memory.row(members),
        }
        for domain, info in domain_info.items():
            e = sums.energy[domain]
            dom = result.dom[domain]
            sigma = math.hypot(
                at.group_sigma(float(e["sharing_abs"][members].sum()),
                               float(e["meas_sq"][members].sum()), dom, int(fit_of_group[g])),
                finite_or_zero(info.get("idle_sigma_W", math.nan)) * total_s)
            inclusive = float(e["inclusive"][members].sum())
            raw_self = float(e["self"][members].sum())
            per_rep = [float(v) for v in e["per_rep"][members].sum(axis=0)]
            rep_mean, rep_lo, rep_hi = mean_ci95(np.array(per_rep))
            pieces = int(e["n"][members].sum())
            row["energy"][domain] = {
                "sensor": info["sensor"], "provenance": info["provenance"],
                "model": info["model"], "method": info["method"],
                "above_idle_J": inclusive,
                "total_J": float(e["total"][members].sum()), "self_J": raw_self,
                "uncertainty_J": sigma,
                "per_call": {**_summary(streamed.moments(e, members), inclusive),
                             "noise_J": sigma / calls if calls else math.nan},
                "share": raw_self / above[domain], "inclusive_share": inclusive / above[domain],
                "share_sigma": sigma / above[domain],
                "below_resolution_share": float(e["below"][members].sum() / pieces)
                if pieces else math.nan,
                "per_rep_J": per_rep, "rep_mean_J": rep_mean,
                "rep_ci95_low": rep_lo, "rep_ci95_high": rep_hi,
            }
            floor_at_zero(row["energy"][domain], sigma, calls, len(result.rep_ids))
        row["all_domains"] = cross_domain(row["energy"])
        rows.append(row)
    return rows


def _summary(m: Any, total: float) -> dict[str, float]:
    """`aggregate._summary` from merged moments; the median is not streamed (NaN)."""
    n = m.pieces
    if n == 0:
        return {"sum": total, "mean": math.nan, "median": math.nan, "stdev": math.nan,
                "ci95_low": math.nan, "ci95_high": math.nan}
    sd = math.sqrt(m.m2 / (n - 1)) if n > 1 else math.nan
    half = t_quantile(0.975, n - 1) * sd / math.sqrt(n) if n > 1 else math.nan
    return {"sum": total, "mean": m.mean_s, "median": math.nan, "stdev": sd,
            "ci95_low": m.mean_s - half, "ci95_high": m.mean_s + half}

