"""A run's analysis: load it from the store, attribute energy per domain, aggregate per call site,
per API and per repetition. The CLI summary, the HTML report and JSON/CSV exports all read
`RunAnalysis`, so every figure has one definition.

Per energy domain (cpu-package, dram, gpu:N, ...) one sensor is used, the best the run has: a
measured counter, else measured power, else an estimated power model. Its provenance and model
travel with every figure of that domain; domains are separate columns, and a sum across domains
is labelled `estimated` as soon as one part is.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import contention, noise_floor, pieces
from fecomlite.analysis.calibration import fit_groups
from fecomlite.analysis.devices import (
    attribute_calls,
    device_masks,
    device_owners,
    domain_calls,
)
from fecomlite.analysis.distributions import t_quantile
from fecomlite.analysis.run_mode import idle_sigma_bound, run_mode
from fecomlite.analysis.units import scaled, with_noise
from fecomlite.runtime.batch_codec import PROJECT_SITE
from fecomlite.runtime.calibration_replay import KIND as CALIBRATION_KIND
from fecomlite.sensors.estimate import ABOVE_IDLE_MODELS
from fecomlite.store import Store

ENERGY_KINDS = ("counter", "power")
MOVING_AVERAGE_S = 0.5  # a power sensor that averages over longer than this is never attributed
ADDITIVE_DOMAINS = ("cpu-package", "dram")  # plus gpu:N; cpu-core/uncore/psys overlap these
# A *share* domain is the measured program's part of another domain (its whole): never added to
# a total, and compared with its whole to see whether other processes loaded the machine.
SHARE_OF = {"cpu-process": "cpu-package"}
PART_OF = {"cpu-core": "cpu-package", "uncore": "cpu-package"}  # psys: the whole platform
BUSY_SHARE = 0.10  # other processes above this share of all CPUs: the machine was not quiet
# The host runs the user's own Python between wrapped calls: there, time outside calls is an
# activity of its own (a GPU, synchronised at probe boundaries, is idle between calls).
HOST_DOMAINS = ("cpu-package", "cpu-core", "uncore", "psys", "dram", "cpu-process")
OUTSIDE_CALLS = "<program outside calls>"
RSS_SENSOR = "proc:rss"
GPU_MEMORY_DOMAINS = ("process-gpu-memory", "gpu-memory")  # preferred first, then gpu:N gauges


@dataclass
class RunAnalysis:
    """Everything the report shows about one run.

    run, repetitions: the store's rows. sensors: every sensor with its metadata and whether it
    was attributed. domains: one row per energy domain: the sensor used, provenance, model,
    role/of/addable/meaning (`domain_role`: only `disjoint` domains are ever summed), idle_W
    (where it came from, idle_sigma_W), total_J and above_idle_J (the whole recording), the
    program's figures (`_program_figures`: program_J = in_calls_J + outside_calls_J; tail_J and
    other_J apart), their noise (noise_J, tail_noise_J, resolution_J, outside_calls_noise_J),
    reliable (false for machine-level domains on a busy machine), method. calls: one numpy array
    per column, one row per event, in (rep, start) order: rep, site (index into site_keys), api
    (index into api_names), site_id, pid, tid, t_start_ns, t_end_ns, duration_s, status,
    in/out_bytes, parent (row index, −1), depth, call (the row of the call's first piece:
    `pieces.call_heads`); per-domain dicts {domain: array} of energy_J
    (inclusive, above idle), energy_total_J (with the idle share), self_energy_J, uncertainty_J
    (1σ), below_resolution; memory: rss_start_B, rss_end_B, rss_peak_B, gpu_mem_start_B,
    gpu_mem_end_B, gpu_mem_peak_B (NaN without a sensor), rss_below_resolution,
    gpu_mem_below_resolution (`below_gauge_resolution`). sites, apis: rows from `_aggregate`,
    most costly first; their `share` is of the domain's program_J (NaN when that is within
    noise). per_rep: per repetition totals. share_in_calls: per domain, in_calls_J / program_J.
    load: `machine_load`, whether other processes used the machine. mode: `run_mode`, whether
    the figures are a quick run's rough ones. intensities: per domain, the
    fitted API intensities and the method used (also stored as the run's "intensities" result).
    levels: method-level calls against the project-level total, when both runs exist.
    """

    run: dict[str, Any]
    repetitions: list[dict[str, Any]]
    sensors: list[dict[str, Any]]
    domains: list[dict[str, Any]]
    calls: dict[str, Any]
    sites: list[dict[str, Any]]
    apis: list[dict[str, Any]]
    per_rep: list[dict[str, Any]]
    share_in_calls: dict[str, float]
    intensities: dict[str, Any]
    method: str
    site_keys: list[str] = field(default_factory=list)
    api_names: list[str] = field(default_factory=list)
    levels: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    load: dict[str, Any] = field(default_factory=dict)
    mode: dict[str, Any] = field(default_factory=dict)

    def to_json(self, include_calls: bool = False) -> dict[str, Any]:
        """Plain dicts, lists, floats and strings (NaN → None); per-call rows only when asked."""
        out = {
            "run": self.run, "repetitions": self.repetitions, "sensors": self.sensors,
            "domains": self.domains, "sites": self.sites, "apis": self.apis,
            "per_rep": self.per_rep, "share_in_calls": self.share_in_calls,
            "intensities": self.intensities, "method": self.method, "levels": self.levels,
            "notes": self.notes, "site_keys": self.site_keys, "api_names": self.api_names,
            "load": self.load, "mode": self.mode,
        }
        if include_calls:
            out["calls"] = self.calls
        return _plain(out)

    def tables_csv(self) -> dict[str, str]:
        """{"apis": csv, "sites": csv}: one row per API / site, one column group per domain."""
        mode = self.mode.get("mode", "")
        return {"apis": _table_csv(self.apis, "api", mode),
                "sites": _table_csv(self.sites, "site", mode)}


# -- loading ----------------------------------------------------------------------------------


def _samples(store: Store, sensor_id: int) -> tuple[np.ndarray, np.ndarray]:
    rows = store.samples(sensor_id)
    flat = np.fromiter(chain.from_iterable(rows), float, 2 * len(rows)).reshape(-1, 2)
    t = np.fromiter((r[0] for r in rows), np.int64, len(rows))  # exact: ns exceed 2**53
    return t, flat[:, 1]


def _events(store: Store, run_id: int) -> dict[str, np.ndarray]:
    cols = store.event_columns(run_id)  # numpy columns: no Python object per call
    out = {c: cols[c] for c in ("rep", "site_id", "pid", "tid", "t_start_ns", "t_end_ns",
                                "status")}
    for c in ("in_bytes", "out_bytes"):
        out[c] = np.where(cols[c] < 0, np.nan, cols[c].astype(float))
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
    """One small integer per (pid, tid)."""
    if pid.size == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((tid, pid))
    new = np.concatenate(([True], (np.diff(pid[order]) != 0) | (np.diff(tid[order]) != 0)))
    code = np.empty(pid.size, np.int64)
    code[order] = np.cumsum(new) - 1
    return code


def choose_energy_sensors(
    sensors: list[dict[str, Any]], details: dict[str, Any] | None = None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """The sensor used for each energy domain, and notes on what was passed over and why.

    Rank: measured counter, measured power, estimated counter, estimated power. A power sensor
    that is a moving average over ≥ MOVING_AVERAGE_S (NVML's power usage) is never used: it
    smears a call's energy over the next second.
    """
    details = details or {}
    chosen: dict[str, dict[str, Any]] = {}
    notes: list[str] = []
    for s in sensors:
        if s["kind"] not in ENERGY_KINDS:
            continue
        averaging = (details.get(s["name"]) or {}).get("averaging_s") or 0
        if s["kind"] == "power" and averaging >= MOVING_AVERAGE_S:
            notes.append(f"{s['name']} not attributed: a {averaging:g} s moving average")
            continue
        best = chosen.get(s["domain"])
        if best is None or _rank(s) < _rank(best):
            chosen[s["domain"]] = s
    return chosen, notes


def _rank(sensor: dict[str, Any]) -> tuple[int, int]:
    return (sensor["provenance"] != "measured", sensor["kind"] != "counter")


def _idle_W(run: dict[str, Any], name: str) -> float | None:
    value = (run.get("idle") or {}).get(name)
    if isinstance(value, dict):
        value = value.get("mean_w")
    return None if value is None else float(value)


def idle_baseline(run: dict[str, Any], sensor: dict[str, Any]) -> tuple[float | None, str]:
    """The idle level subtracted from a sensor's readings, and where it came from: 0 W for a
    model that reads above idle, else the run's measured baseline (None: none was stored)."""
    if sensor.get("model") in ABOVE_IDLE_MODELS:
        return 0.0, f"0 W: model {sensor['model']} reads above idle"
    return _idle_W(run, sensor["name"]), "measured baseline"


CPU_BUSY_MEANS = ("machine-level above-idle figures (CPU package, DRAM) are unreliable; the "
                  "program's own share (cpu-process) holds none of their work, but contention "
                  "inflates the CPU time it is made from (see the load below)")


def busy_at(other_pct: float) -> bool:
    """Whether other processes' use of a device (% of it) makes its machine-level figures
    unreliable: the one rule of the analysis and the live view."""
    return other_pct > 100 * BUSY_SHARE


def reliable_when(domain: str, busy: bool) -> bool:
    """Whether a domain's above-idle figures hold when other processes used the machine (busy):
    the machine-level host domains do not (their baseline or power held others' work); a
    share (the program's own part) and a GPU do (GPUs are checked apart)."""
    return not (busy and domain in HOST_DOMAINS and domain_role(domain)["role"] != "share")


def domain_role(domain: str) -> dict[str, Any]:
    """How a domain's figures combine with the others': `disjoint` domains (CPU package, DRAM,
    each GPU) are separate hardware and add up; a `share` is the measured program's part of
    another domain (`of`); a `part` lies inside another domain; `overlaps` covers several."""
    if domain in ADDITIVE_DOMAINS or domain.startswith("gpu:"):
        return {"role": "disjoint", "of": None, "addable": True,
                "meaning": "its own hardware: adds to the other disjoint domains"}
    if domain in SHARE_OF or domain.startswith("process-gpu:"):
        whole = SHARE_OF.get(domain) or "gpu:" + domain.split(":", 1)[1]
        return {"role": "share", "of": whole, "addable": False,
                "meaning": f"the measured program's share of {whole}, counted from 0 W: "
                           f"part of {whole}, never added to it"}
    if domain in PART_OF:
        return {"role": "part", "of": PART_OF[domain], "addable": False,
                "meaning": f"a part of {PART_OF[domain]}: never added to it"}
    return {"role": "overlaps", "of": None, "addable": False,
            "meaning": "overlaps the other domains: never added to them"}


def _addable(domain: str) -> bool:
    return bool(domain_role(domain)["addable"])


def ceiling_W(
    sensor: dict[str, Any], details: dict[str, Any], values: np.ndarray, idle: float
) -> float:
    """The most any call can draw above idle in this domain: an estimate's model maximum (less
    idle), else a power sensor's highest reading above idle; unbounded for a counter."""
    params = (details.get(sensor["name"]) or {}).get("model_params") or {}
    top = None
    if params.get("max_w") is not None:
        top = float(params["max_w"]) - (float(params.get("idle_w") or 0.0)
                                        if sensor["model"] in ABOVE_IDLE_MODELS else idle)
    elif params.get("gib") is not None and params.get("static_w_per_gib") is not None:
        top = float(params["gib"]) * (float(params["static_w_per_gib"])
                                      + float(params.get("active_w_per_gib") or 0.0)) - idle
    elif sensor["kind"] == "power" and values.size:
        top = float(np.nanmax(values)) - idle
    return max(top, 0.0) if top is not None and math.isfinite(top) else math.inf


# -- memory -----------------------------------------------------------------------------------


def gauge_during(
    t: np.ndarray, v: np.ndarray, t0: np.ndarray, t1: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value at start, value at end, peak) of a gauge for each [t0, t1]: the last sample at or
    before the start (what the call started with) and the first at or after the end (what it
    left behind), each the nearest other sample when there is none; the peak is the maximum of
    the samples inside plus those two (a short call between two samples gets its neighbours)."""
    n = t.size
    if n == 0:
        nan = np.full(t0.size, np.nan)
        return nan, nan.copy(), nan.copy()
    before0 = np.clip(np.searchsorted(t, t0, "right") - 1, 0, n - 1)
    after1 = np.clip(np.searchsorted(t, t1, "left"), 0, n - 1)
    lo, hi = before0, np.maximum(after1, before0) + 1
    idx = np.empty(2 * lo.size, np.int64)
    idx[0::2], idx[1::2] = lo, hi
    peak = np.maximum.reduceat(np.append(v, v[-1]), idx)[0::2] if idx.size else np.zeros(0)
    return v[before0], v[after1], peak


def _memory(
    store: Store, sensors: list[dict[str, Any]], t0: np.ndarray, t1: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """RSS and GPU memory columns per call, and which sensor gave each (empty when none)."""
    cols: dict[str, np.ndarray] = {}
    used: dict[str, str] = {}
    nan = np.full(t0.size, np.nan)
    rss = next((s for s in sensors if s["name"] == RSS_SENSOR), None)
    if rss is None:
        rss = next((s for s in sensors if s["domain"] == "process-memory"
                    and s["kind"] == "gauge" and "peak" not in s["name"]), None)
    unresolved = np.ones(t0.size, bool)
    if rss is not None:
        t, v = _samples(store, rss["id"])
        start, end, peak = gauge_during(t, v, t0, t1)
        unresolved = below_gauge_resolution(t, t0, t1)
        used["rss"] = rss["name"]
    else:
        start, end, peak = nan, nan.copy(), nan.copy()
    cols.update(rss_start_B=start, rss_end_B=end, rss_peak_B=peak,
                rss_below_resolution=unresolved)
    gpu = _gpu_memory_sensors(sensors)
    series = [_samples(store, s["id"]) for s in gpu]
    parts = [gauge_during(t, v, t0, t1) for t, v in series]
    if parts:
        used["gpu_memory"] = ", ".join(s["name"] for s in gpu)
    for i, name in enumerate(("gpu_mem_start_B", "gpu_mem_end_B", "gpu_mem_peak_B")):
        cols[name] = np.sum([p[i] for p in parts], axis=0) if parts else nan.copy()
    cols["gpu_mem_below_resolution"] = np.any(
        [below_gauge_resolution(t, t0, t1) for t, _ in series], axis=0) if series else (
        np.ones(t0.size, bool))
    return cols, used


def first_of_site(
    rep: np.ndarray, pid: np.ndarray, site: np.ndarray, status: np.ndarray
) -> np.ndarray:
    """Each site's first call in each process of each repetition (events in start order): where
    first-use work lands (imports, caches, lazy initialisation), which later calls do not do."""
    out = np.zeros(rep.size, bool)
    heads = np.flatnonzero(pieces.is_call(status))
    if heads.size:
        keys = np.stack((rep[heads], pid[heads], site[heads]), axis=1)
        _, first = np.unique(keys, axis=0, return_index=True)
        out[heads[first]] = True
    return out


def below_gauge_resolution(t: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Calls a memory gauge cannot resolve: shorter than its sampling period (the median gap
    between its samples), or with no sample inside. Such a call's start and end levels are its
    neighbours' too (two short calls in one gap would both be given the gap's drop), so it
    gets no memory figure of its own."""
    if t.size < 2:
        return np.ones(t0.size, bool)
    period_ns = float(np.median(np.diff(t)))
    inside = np.searchsorted(t, t1, "left") - np.searchsorted(t, t0, "right")
    return (inside <= 0) | ((t1 - t0) < period_ns)


def _gpu_memory_sensors(sensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The process's GPU memory per GPU where known, else the devices' memory in use."""
    gauges = [s for s in sensors if s["kind"] == "gauge" and s["unit"] == "B"]
    for domain in GPU_MEMORY_DOMAINS:
        found = [s for s in gauges if s["domain"] == domain]
        if found:
            return found
    return [s for s in gauges if s["domain"].startswith("gpu:")]


# -- statistics -------------------------------------------------------------------------------


def mean_ci95(values: np.ndarray) -> tuple[float, float, float]:
    """(mean, low, high): the 95 % t-interval of the mean; NaN bounds with fewer than 2 values."""
    values = values[np.isfinite(values)]
    if values.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    t = t_quantile(0.975, values.size - 1)
    half = t * float(values.std(ddof=1)) / math.sqrt(values.size)
    return mean, mean - half, mean + half


def _summary(values: np.ndarray) -> dict[str, float]:
    mean, lo, hi = mean_ci95(values)
    return {
        "sum": float(values.sum()), "mean": mean,
        "median": float(np.median(values)) if values.size else math.nan,
        "stdev": float(values.std(ddof=1)) if values.size > 1 else math.nan,
        "ci95_low": lo, "ci95_high": hi,
    }


# -- the analysis -----------------------------------------------------------------------------


def analyse_run(
    store: Store, run_id: int, method: str = "auto", *, compare_levels: bool = True
) -> RunAnalysis:
    """Attribute every energy domain of run `run_id` and aggregate; stores the intensities."""
    if method not in at.METHODS:
        raise ValueError(f"method must be one of {at.METHODS}, not {method!r}")
    run = store.run(run_id)
    reps = store.repetitions(run_id)
    sensors = store.sensors(run_id)
    details = store.result(run_id, "sensors") or {}
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
    fit_of_api = np.array(fit_index, dtype=np.int64)
    fit_of = fit_of_api[api_of]
    replay = np.array([s["kind"] == CALIBRATION_KIND for s in sites], bool)[site_of] if n else (
        np.zeros(0, bool))
    program = np.array([s["api"] == PROJECT_SITE for s in sites], bool)[site_of] if n else (
        np.zeros(0, bool))
    thread = _threads(ev["pid"], _program_on_main_thread(ev, program))
    parent, depth = at.nesting(t0, t1, thread)

    calls: dict[str, Any] = {
        "site": site_of, "api": api_of, **ev, "duration_s": (t1 - t0) / at.NS,
        "parent": parent, "depth": depth,
        "call": pieces.call_heads(ev["rep"], ev["pid"], ev["tid"], site_of, t0, ev["status"]),
        "energy_J": {}, "energy_total_J": {}, "self_energy_J": {}, "uncertainty_J": {},
        "below_resolution": {},
    }
    chosen, notes = choose_energy_sensors(sensors, details)
    baseline = store.result(run_id, "idle_baseline") or {}
    domains: list[dict[str, Any]] = []
    intensities: dict[str, Any] = {}
    methods_used: set[str] = set()
    rep_energy: dict[str, list[dict[str, float]]] = {}
    results: dict[str, at.Attribution] = {}
    rep_windows = _rep_windows(reps, ev)
    on_device = device_masks(device_owners(store.processes(run_id)), ev["pid"])
    host = _with_program_gaps(t0, t1, thread, fit_of, len(fit_names), reps, t0[replay])
    for domain, sensor in sorted(chosen.items()):
        t, v = _samples(store, sensor["id"])
        try:
            iv = at.sensor_intervals(sensor["kind"], t, v, period_s=sensor.get("period_s"))
        except ValueError as exc:
            notes.append(f"{domain}: {sensor['name']} skipped: {exc}")
            continue
        if iv.count == 0:
            notes.append(f"{domain}: {sensor['name']} has too few updates to attribute")
            continue
        idle, idle_source = idle_baseline(run, sensor)
        if idle is None:
            idle = at.estimate_idle_W(iv, t0, t1)
            idle_source = "estimated from quiet intervals (no baseline stored)"
        activities = fit_names
        ceiling = ceiling_W(sensor, details, v, idle)
        if domain in HOST_DOMAINS and host is not None:
            res = _calls_only(at.attribute(iv, method=method, idle_W=idle, ceiling_W=ceiling,
                                           **host), n)
            activities = [*fit_names, OUTSIDE_CALLS]
        else:  # a GPU's (a merged node's) energy to its processes' calls: distributed runs
            res = attribute_calls(
                iv, domain_calls(on_device, domain), t0, t1, idle_W=idle, thread=thread,
                group=fit_of, method=method, ngroups=max(len(fit_names), 1), nest=(parent, depth),
                ceiling_W=ceiling,
            )
        methods_used.add(res.method)
        results[domain] = res
        for key, arr in (("energy_J", res.energy_J), ("energy_total_J", res.energy_total_J),
                         ("self_energy_J", res.self_energy_J),
                         ("uncertainty_J", res.uncertainty_J),
                         ("below_resolution", res.below_resolution)):
            calls[key][domain] = arr
        rep_energy[domain] = _rep_energy(iv, idle, reps)
        in_reps = sum(at.window_energy(iv, idle, a, b)[1] for a, b in rep_windows)
        domains.append({
            "domain": domain, "sensor": sensor["name"], "kind": sensor["kind"],
            "provenance": sensor["provenance"], "model": sensor["model"],
            **domain_role(domain),
            "period_s": iv.period_s, "idle_W": idle, "idle_source": idle_source,
            "ceiling_W": ceiling,  # no call is given more power above idle (attribution)
            "idle_sigma_W": 0.0 if sensor["model"] in ABOVE_IDLE_MODELS else _idle_sigma_W(
                baseline, sensor["name"]),
            "total_J": res.total_J, "idle_J": res.idle_J, "above_idle_J": res.above_idle_J,
            "in_calls_J": res.in_calls_J, "in_calls_total_J": res.in_calls_total_J,
            "above_idle_in_reps_J": in_reps, "method": res.method, "fell_back": res.fell_back,
            **_program_figures(rep_energy[domain], res, reps),
            "recording_s": float(iv.lengths_s.sum()),
        })
        intensities[domain] = _intensity_record(res, activities, method)
    if intensities and not store.readonly:  # a report reads the store, never writes it
        store.put_result(run_id, "intensities", _plain(intensities))

    memory, memory_sensors = _memory(store, sensors, t0, t1)
    calls.update(memory)
    calls["first_use"] = first_of_site(ev["rep"], ev["pid"], site_of, ev["status"])
    dom_info = {d["domain"]: d for d in domains}
    for d in domains:
        # the idle baseline's spread over the program's time; and the sensor's resolution: the
        # intervals cut by each repetition's start and end go to calls or not by their overlap
        d["noise_J"] = d["idle_sigma_W"] * d["program_s"]
        d["tail_noise_J"] = d["idle_sigma_W"] * d["tail_s"]
        d["other_noise_J"] = d["idle_sigma_W"] * max(
            d["recording_s"] - d["program_s"] - d["tail_s"], 0.0)
        d["above_noise_J"] = d["idle_sigma_W"] * d["recording_s"]
        rate = abs(d["program_J"]) / d["program_s"] if d["program_s"] > 0 else 0.0
        d["resolution_J"] = 2 * max(len(reps), 1) * finite_or_zero(d["period_s"]) * rate
        d["outside_calls_noise_J"] = math.hypot(finite_or_zero(d["noise_J"]), d["resolution_J"])
    notes += _share_notes(domains)
    load = machine_load(store, sensors, baseline, reps)
    for d in domains:
        busy = d["domain"] in load["busy_domains"] and d["role"] != "share"
        d["unreliable"] = [load["busy_domains"][d["domain"]]] if busy else []
        d["reliable"] = not busy
        # what load did to it, with the size (`contention`): marked, not hidden
        d["load_effect"] = contention.effects(load["contention"], d["domain"])
        d["load_distortion"] = load["contention"]["distortion"] if d["load_effect"] else None
    above_by_domain = {d["domain"]: d["program_J"] if d["program_J"] > finite_or_zero(d["noise_J"])
                       else math.nan for d in domains}
    site_rows = _aggregate(calls, site_of, len(sites), dom_info, above_by_domain, reps,
                           results, fit_of_api[api_of_site])
    for row, s in zip(site_rows, sites, strict=True):
        row.update({k: s[k] for k in ("key", "file", "line", "col", "api", "written", "kind",
                                      "function", "source")})
    api_rows = _aggregate(calls, api_of, len(api_names), dom_info, above_by_domain, reps,
                          results, fit_of_api)
    for i, row in enumerate(api_rows):
        row["api"] = api_names[i]
        members = [s for s, a in zip(sites, api_of_site, strict=True) if a == i]
        row["written"] = sorted({s["written"] for s in members if s["written"]})
        row["sites"] = len(members)
    site_rows = [r for r in site_rows if r["calls"]]
    api_rows = [r for r in api_rows if r["calls"]]
    flagged = _below_zero_reasons(domains, api_rows, "APIs", "api")
    _below_zero_reasons(domains, site_rows, "call sites", "key", skip=flagged)
    order_key = _sort_key(domains)
    site_rows.sort(key=order_key, reverse=True)
    api_rows.sort(key=order_key, reverse=True)

    share = {d["domain"]: d["in_calls_J"] / above_by_domain[d["domain"]] for d in domains}
    for d in domains:  # the last row of the self shares: with the APIs' they make 100 %
        d["outside_calls_share"] = d["outside_calls_J"] / above_by_domain[d["domain"]]
    if memory_sensors:
        notes.append("memory from " + "; ".join(f"{k}: {v}" for k, v in memory_sensors.items()))
    analysis = RunAnalysis(
        run=run, repetitions=reps, sensors=_sensor_rows(sensors, details, chosen),
        domains=domains, calls=calls, sites=site_rows, apis=api_rows,
        per_rep=_per_rep(calls, reps, dom_info, rep_energy),
        share_in_calls=share, intensities=intensities,
        method="+".join(sorted(methods_used)) or "none", notes=notes,
        site_keys=[s["key"] for s in sites], api_names=api_names, load=load,
        mode=run_mode(run.get("settings") or {}),
    )
    if compare_levels:
        analysis.levels = _compare_levels(store, run, analysis, method)
    return analysis


def program_gaps(
    t0: np.ndarray, t1: np.ndarray, windows: list[tuple[int, int]]
) -> tuple[np.ndarray, np.ndarray]:
    """The stretches of each [start, end) window covered by no call (of any thread)."""
    starts, ends = [], []
    for a, b in windows:
        inside = (t1 > a) & (t0 < b)
        order = np.argsort(t0[inside], kind="stable")
        s = np.clip(t0[inside][order], a, b)
        e = np.maximum.accumulate(np.clip(t1[inside][order], a, b)) if s.size else s
        gap_start = np.concatenate(([a], e))
        gap_end = np.concatenate((s, [b]))
        keep = gap_end > gap_start
        starts.append(gap_start[keep])
        ends.append(gap_end[keep])
    if not starts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(starts).astype(np.int64), np.concatenate(ends).astype(np.int64)


def _with_program_gaps(
    t0: np.ndarray, t1: np.ndarray, thread: np.ndarray, api_of: np.ndarray, n_apis: int,
    reps: list[dict[str, Any]], replay_starts: np.ndarray,
) -> dict[str, Any] | None:
    """attribute() arguments with the program's time outside calls as one more activity; a
    calibration repetition's program ends where its replays begin (the gaps between replays are
    idle, not the program's)."""
    windows = []
    for r in reps:
        a, b = r.get("t_start_ns"), r.get("t_end_ns")
        if a is not None and b is not None:
            inside = replay_starts[(replay_starts >= a) & (replay_starts <= b)]
            windows.append((int(a), int(inside.min()) if inside.size else int(b)))
    g0, g1 = program_gaps(t0, t1, windows)
    if g0.size == 0:
        return None
    all_t0, all_t1 = np.concatenate((t0, g0)), np.concatenate((t1, g1))
    gap_thread = (int(thread.max()) + 1) if thread.size else 0
    threads = np.concatenate((thread, np.full(g0.size, gap_thread, np.int64)))
    return {
        "t_start_ns": all_t0, "t_end_ns": all_t1, "thread": threads,
        "group": np.concatenate((api_of, np.full(g0.size, n_apis, np.int64))),
        "ngroups": n_apis + 1, "nest": at.nesting(all_t0, all_t1, threads),
    }


def _calls_only(res: at.Attribution, n: int) -> at.Attribution:
    """The wrapped calls' part of an attribution made with the program-gap activity."""
    per_call = {
        f.name: getattr(res, f.name)[:n] for f in dataclasses.fields(res)
        if isinstance(getattr(res, f.name), np.ndarray) and getattr(res, f.name).ndim == 1
        and getattr(res, f.name).size >= n
    }
    top = per_call["parent"] < 0
    in_calls = float(per_call["energy_J"][top].sum())
    in_calls_total = float(per_call["energy_total_J"][top].sum())
    return dataclasses.replace(
        res, **per_call, in_calls_J=in_calls, in_calls_total_J=in_calls_total,
        outside_calls_J=res.above_idle_J - in_calls,
        outside_calls_total_J=res.total_J - in_calls_total,
    )


def _rep_windows(reps: list[dict[str, Any]], ev: dict[str, np.ndarray]) -> list[tuple[int, int]]:
    """[start, end of tail] of each repetition; the events' span when no repetition is stored."""
    windows = []
    for r in reps:
        end = r.get("tail_end_ns") or r.get("t_end_ns")
        if r.get("t_start_ns") is not None and end is not None:
            windows.append((int(r["t_start_ns"]), int(end)))
    if not windows and ev["t_start_ns"].size:
        windows.append((int(ev["t_start_ns"].min()), int(ev["t_end_ns"].max())))
    return windows


def _rep_energy(
    iv: at.SensorIntervals, idle: float, reps: list[dict[str, Any]]
) -> list[dict[str, float]]:
    """Per repetition: the sensor's energy from its start to the program's end, and its tail."""
    out = []
    for r in reps:
        a, b, c = r.get("t_start_ns"), r.get("t_end_ns"), r.get("tail_end_ns")
        total, above = at.window_energy(iv, idle, a, b) if None not in (a, b) else (
            math.nan, math.nan)
        tail = at.window_energy(iv, idle, b, c)[1] if None not in (b, c) else math.nan
        out.append({"total_J": total, "above_idle_J": above, "tail_J": tail})
    return out


def _idle_sigma_W(baseline: dict[str, Any], name: str) -> float:
    """The idle baseline's spread (σ of its readings) at the 95 % upper bound its number of
    readings allows (`run_mode.idle_sigma_bound`: a 1 s baseline's σ is no tighter than its
    readings say), NaN when no baseline was measured."""
    entry = (baseline.get("sensors") or {}).get(name) or {}
    value = entry.get("std_w")
    if value is None:
        return math.nan
    n = entry.get("n")
    return idle_sigma_bound(float(value), int(n) if isinstance(n, (int, float)) else None)


def _program_figures(
    rep_energy: list[dict[str, float]], res: at.Attribution, reps: list[dict[str, Any]]
) -> dict[str, float]:
    """The run's figures of one domain, each with what it covers (`RunAnalysis.domains`).

    program_J: above idle while the program ran (the repetitions, start to end), the base of
    every share; in_calls_J (wrapped calls, top level) + outside_calls_J (the program between
    calls) = program_J; tail_J: after the program ended, sampled on; other_J: the rest of the
    recording (idle baseline, gate waits, pauses), when no program ran; above_idle_J = program_J
    + tail_J + other_J. program_s and tail_s: how long each lasted, for the noise figures."""
    program = sum(e["above_idle_J"] for e in rep_energy if math.isfinite(e["above_idle_J"]))
    tail = sum(e["tail_J"] for e in rep_energy if math.isfinite(e["tail_J"]))
    program_s = sum(_span_s(r.get("t_start_ns"), r.get("t_end_ns")) for r in reps
                    if r.get("t_end_ns") is not None and r.get("t_start_ns") is not None)
    tail_s = sum(_span_s(r.get("t_end_ns"), r.get("tail_end_ns")) for r in reps
                 if r.get("tail_end_ns") is not None and r.get("t_end_ns") is not None)
    if not reps:  # no repetition stored: the recording is the program
        program = res.above_idle_J
    return {
        "program_J": program, "program_s": program_s,
        "outside_calls_J": program - res.in_calls_J,
        "tail_J": tail, "tail_s": tail_s,
        "other_J": res.above_idle_J - program - tail,
    }


def machine_load(
    store: Store, sensors: list[dict[str, Any]], baseline: dict[str, Any],
    reps: list[dict[str, Any]],
) -> dict[str, Any]:
    """Whether other processes used the CPUs or a GPU during the idle baseline or the
    repetitions. CPUs: the machine's utilisation (util:cpu) less the measured process tree's
    (util:process), in % of all CPUs. GPUs: NVML's per-process SM utilisation of every process
    (nvml:N:processes_sm) less the tree's (nvml:N:process_sm), in % of that GPU's SM time.
    Above BUSY_SHARE the machine-level above-idle figures of that device are unreliable: its
    baseline or the program's power held other processes' work. `busy_domains`: {domain: why}."""
    out: dict[str, Any] = {"checked": [], "not_checked": [], "busy": False, "text": "",
                           "baseline_other_pct": math.nan, "program_other_pct": math.nan,
                           "cpu_busy": False, "gpus": [], "busy_domains": {}}
    windows = [(r["t_start_ns"], r["t_end_ns"]) for r in reps
               if r.get("t_start_ns") is not None and r.get("t_end_ns") is not None]
    span = (baseline.get("t_start_ns"), baseline.get("t_end_ns"))
    baseline_window = span if None not in span else None
    by_name = {s["name"]: s for s in sensors}
    texts = []
    machine = by_name.get("util:cpu")
    if machine is None:
        out["not_checked"].append("CPU: no machine utilisation was recorded")
    else:
        cpu = _other_load(store, machine, by_name.get("util:process"), baseline_window, windows,
                          "CPU", "the program's own utilisation")
        out["checked"] += cpu["checked"]
        out["not_checked"] += cpu["not_checked"]
        out["baseline_other_pct"], out["program_other_pct"] = cpu["baseline"], cpu["program"]
        out["cpu_busy"] = cpu["busy"]
        if cpu["busy"]:
            out["busy_domains"].update(dict.fromkeys(HOST_DOMAINS, (
                f"other processes used the CPUs ({cpu['parts']} of all CPUs): the machine's "
                "above-idle power includes their work")))
            texts.append("The CPUs were busy: other processes used them ("
                         + cpu["parts"] + " of all CPUs): " + CPU_BUSY_MEANS + ".")
        else:
            texts.append("The CPUs were quiet: other processes used "
                         + (cpu["parts"] or "nothing measurable") + " of all CPUs.")
    gpus = sorted({s["domain"] for s in sensors if s["domain"].startswith("gpu:")})
    if not gpus:
        out["checked"].append("GPUs: none on this machine")
        texts.append("No GPU.")
    for gpu in gpus:
        index = gpu.partition(":")[2]
        every = by_name.get(f"nvml:{index}:processes_sm")
        if every is None:
            out["not_checked"].append(f"{gpu}: NVML gave no per-process utilisation, so other "
                                      "processes' use of this GPU could not be read")
            continue
        g = _other_load(store, every, by_name.get(f"nvml:{index}:process_sm"), baseline_window,
                        windows, gpu, "the program's own use of it")
        out["checked"] += g["checked"]
        out["not_checked"] += g["not_checked"]
        out["gpus"].append({"gpu": gpu, "baseline_other_pct": g["baseline"],
                            "program_other_pct": g["program"], "busy": g["busy"]})
        if g["busy"]:
            out["busy_domains"][gpu] = (f"other processes used {gpu} ({g['parts']} of its "
                                        "compute time): its above-idle power includes their work")
            texts.append(f"Other processes used {gpu} ({g['parts']} of its compute time): its "
                         "above-idle figures are unreliable.")
        else:
            texts.append(f"{gpu} was quiet: other processes used "
                         f"{g['parts'] or 'nothing measurable'} of its compute time.")
    out["busy"] = bool(out["busy_domains"])
    rep_windows = [(r["rep"], r["t_start_ns"], r["t_end_ns"]) for r in reps
                   if r.get("t_start_ns") is not None and r.get("t_end_ns") is not None]
    out["contention"] = contention.measure(
        {name: _samples(store, by_name[name]["id"]) for name in contention.SENSORS
         if name in by_name}, rep_windows)
    texts.append(out["contention"]["text"])
    out["text"] = " ".join(texts)
    return out


def _other_load(
    store: Store, machine: dict[str, Any], own: dict[str, Any] | None,
    baseline: tuple[int, int] | None, windows: list[tuple[int, int]], device: str,
    own_words: str,
) -> dict[str, Any]:
    """Other processes' mean utilisation of one device (%), during the baseline (everything
    there is other) and the repetitions (the machine's less the tree's `own` sensor)."""
    tm, vm = _samples(store, machine["id"])
    tp, vp = _samples(store, own["id"]) if own else (np.zeros(0, np.int64), np.zeros(0))

    def other(a: int, b: int, with_program: bool) -> float:
        inside = (tm > a) & (tm <= b)
        if not inside.any():
            return math.nan
        mine = np.interp(tm[inside], tp, vp) if with_program and tp.size else 0.0
        return float(np.mean(np.clip(vm[inside] - mine, 0, None)))

    out: dict[str, Any] = {"checked": [], "not_checked": [], "baseline": math.nan,
                           "program": math.nan}
    if baseline is not None:
        out["baseline"] = other(*baseline, False)
        out["checked"].append(f"{device} during the idle baseline")
    if windows and own is not None:
        values = [other(a, b, True) for a, b in windows]
        out["program"] = float(np.nanmean(values)) if np.isfinite(values).any() else math.nan
        out["checked"].append(f"{device} during the repetitions")
    elif windows:
        out["not_checked"].append(f"{device} during the repetitions: {own_words} was not "
                                  "recorded")
    worst = np.nanmax([out["baseline"], out["program"], 0.0])
    out["busy"] = busy_at(float(worst))
    out["parts"] = ", ".join(f"{label} {value:.0f} %" for label, value in (
        ("during the idle baseline", out["baseline"]),
        ("during the repetitions", out["program"])) if math.isfinite(value))
    return out


def _share_notes(domains: list[dict[str, Any]]) -> list[str]:
    """A share domain beside its whole: what each counts, and a warning where the share exceeds
    the whole (the whole's idle baseline held other processes' load)."""
    by_name = {d["domain"]: d for d in domains}
    notes = []
    for d in domains:
        whole = by_name.get(d["of"] or "")
        if d["role"] != "share" or whole is None:
            continue
        text = (f"{d['domain']} is the program's own share of {whole['domain']}, counted from "
                f"0 W; {whole['domain']} above idle is the whole machine's power less its idle "
                "baseline. The two are never added.")
        if d["program_J"] > whole["program_J"] + finite_or_zero(whole["noise_J"]):
            text += (f" Here the share ({scaled(d['program_J'], 'J')}) exceeds the whole above "
                     f"idle ({with_noise(whole['program_J'], whole['noise_J'])}): the baseline was "
                     "not idle (other "
                     f"processes were running), so {whole['domain']} above idle is too low.")
        notes.append(text)
    return notes


def finite_or_zero(value: Any) -> float:
    """A figure that may be missing (None, NaN, not a number) as a term of a sum: 0."""
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else 0.0


def _intensity_record(res: at.Attribution, api_names: list[str], asked: str) -> dict[str, Any]:
    fit = res.fit
    record: dict[str, Any] = {"asked": asked, "method": res.method, "fell_back": res.fell_back}
    if fit is None:
        return record
    record.update({
        "supported": fit.supported, "reason": fit.reason, "pooled_W": fit.pooled_W,
        "cv_gain": fit.cv_gain, "wald_p": fit.wald_p, "rel_residual": fit.rel_residual,
        "intervals": fit.rows, "ceiling_W": fit.ceiling_W,
        "apis": {
            name: {"intensity_W": float(fit.intensity_W[i]), "sigma_W": float(fit.sigma_W[i]),
                   "busy_s": float(fit.busy_s[i]), "distinct": bool(fit.distinct[i]),
                   "identifiable": bool(fit.identifiable[i]), "capped": bool(fit.capped[i])}
            for i, name in enumerate(api_names) if fit.busy_s[i] > 0
        },
    })
    return record


def _aggregate(
    calls: dict[str, Any], group: np.ndarray, ngroups: int, domains: dict[str, dict[str, Any]],
    above: dict[str, float], reps: list[dict[str, Any]], results: dict[str, at.Attribution],
    api_of_group: np.ndarray,
) -> list[dict[str, Any]]:
    """One row per group (site or API); api_of_group: each group's API index (its fitted
    intensity sets the group's uncertainty).

    Row: calls (continuations are pieces of a call, not calls: `pieces`), raised (calls of which a
    piece raised), total_time_s (inclusive), mean_time_s (per call, its pieces summed),
    per_rep_calls (calls in each repetition); energy:
    {domain: {sensor, provenance, model, method, above_idle_J (Σ inclusive), total_J (with idle
    share), self_J, uncertainty_J (1σ of the sum, `attribution.group_uncertainty`), per_call: {sum,
    mean, median, stdev, ci95_low, ci95_high}, share (self_J of the repetitions' above-idle
    energy: over all rows, with the domain's outside_calls_share, 100 %), inclusive_share
    (above_idle_J's: nested rows overlap, as in a profiler), below_resolution_share, per_rep_J,
    rep_mean_J, rep_ci95_low, rep_ci95_high, and never below zero (`_floor_at_zero`):
    below_zero, raw_above_idle_J, raw_self_J, raw_per_rep_J}}; all_domains: the sum over
    additive domains with its provenance (raw_above_idle_J, below_zero likewise); memory:
    rss_peak_max_B, rss_delta_mean_B, gpu_mem_peak_max_B, gpu_mem_delta_mean_B."""
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(ngroups + 1))
    rep = calls["rep"]
    rep_ids = [r["rep"] for r in reps] or sorted(set(rep.tolist()))
    rows = []
    heads = calls["call"]
    for g in range(ngroups):
        idx = order[bounds[g]:bounds[g + 1]]
        n_calls = pieces.call_count(calls["status"][idx])
        total_s = float(calls["duration_s"][idx].sum())
        row: dict[str, Any] = {
            "calls": n_calls,
            "raised": pieces.calls_raised(heads, idx, calls["status"]),
            "total_time_s": total_s,
            "mean_time_s": total_s / n_calls if n_calls else math.nan,
            # calls in each repetition: with per_rep_J, each repetition's energy per call
            "per_rep_calls": [pieces.call_count(calls["status"][idx][rep[idx] == r])
                              for r in rep_ids],
            "energy": {},
            "memory": _memory_row(calls, idx),
        }
        busy_s = row["total_time_s"]
        for domain, info in domains.items():
            e = calls["energy_J"][domain][idx]
            raw_self = float(calls["self_energy_J"][domain][idx].sum())
            per_rep = [float(e[rep[idx] == r].sum()) for r in rep_ids]
            rep_mean, rep_lo, rep_hi = mean_ci95(np.array(per_rep))
            # the sharing inside sensor intervals, and the idle baseline's own spread over the
            # calls' time (what subtracting an idle level that drifts can be off by)
            sigma = math.hypot(
                at.group_uncertainty(results[domain], idx, int(api_of_group[g])),
                finite_or_zero(info.get("idle_sigma_W", math.nan)) * busy_s)
            row["energy"][domain] = {
                "sensor": info["sensor"], "provenance": info["provenance"],
                "model": info["model"], "method": info["method"],
                "above_idle_J": float(e.sum()),
                "total_J": float(calls["energy_total_J"][domain][idx].sum()),
                "self_J": raw_self,
                "uncertainty_J": sigma,
                "per_call": {**_summary(pieces.per_call(heads, idx, calls["energy_J"][domain])),
                             "noise_J": sigma / n_calls if n_calls else math.nan},
                # self: over the APIs, with the program outside calls, it sums to 100 %;
                # inclusive counts nested calls in their callers too and sums to more
                "share": raw_self / above[domain],
                "inclusive_share": float(e.sum() / above[domain]),
                "share_sigma": sigma / above[domain],
                "below_resolution_share": float(calls["below_resolution"][domain][idx].mean())
                if idx.size else math.nan,
                "per_rep_J": per_rep, "rep_mean_J": rep_mean,
                "rep_ci95_low": rep_lo, "rep_ci95_high": rep_hi,
            }
            _floor_at_zero(row["energy"][domain], sigma, n_calls, len(rep_ids))
        row["all_domains"] = cross_domain(row["energy"])
        rows.append(row)
    return rows


def _floor_at_zero(e: dict[str, Any], sigma: float, calls: int, reps: int) -> None:
    """Never below zero (`noise_floor`): the raw above-idle, self and per-repetition estimates
    stay as raw_*; the shown figures are 0 within noise, NaN beyond it (`below_zero` says
    which); per-call and per-repetition figures by their own noise (σ over the calls, the
    repetitions)."""
    raw_above, raw_self = e["above_idle_J"], e["self_J"]
    states = {noise_floor.below_zero(raw_above, sigma), noise_floor.below_zero(raw_self, sigma)}
    e["raw_above_idle_J"], e["raw_self_J"] = raw_above, raw_self
    e["below_zero"] = next((s for s in (noise_floor.BEYOND_NOISE, noise_floor.WITHIN_NOISE)
                            if s in states), None)
    e["above_idle_J"] = noise_floor.shown(raw_above, sigma)
    e["self_J"] = noise_floor.shown(raw_self, sigma)
    # below zero: a share is 0 within noise, else unknown
    if e["self_J"] != raw_self:
        e["share"] = 0.0 if e["self_J"] == 0 else math.nan
    if e["above_idle_J"] != raw_above:
        e["inclusive_share"] = 0.0 if e["above_idle_J"] == 0 else math.nan
    per_call = e["per_call"]
    per_call["sum"] = e["above_idle_J"]
    for key in ("mean", "median"):
        per_call[key] = noise_floor.shown(per_call[key], sigma / max(calls, 1))
    e["rep_mean_J"] = noise_floor.shown(e["rep_mean_J"], sigma / max(reps, 1))
    e["raw_per_rep_J"] = e["per_rep_J"]  # for statistics over repetitions (the sweep)
    e["per_rep_J"] = [noise_floor.shown(v, sigma / math.sqrt(max(reps, 1)))
                      for v in e["per_rep_J"]]


def _below_zero_reasons(
    domains: list[dict[str, Any]], rows: list[dict[str, Any]], name: str, label: str,
    skip: Collection[str] = (),
) -> set[str]:
    """Flag a domain unreliable where some of its per-API (per-site) figures fell below zero
    beyond their noise, with the reason in words (those figures are not shown); the domains
    flagged, to `skip` in the next pass."""
    flagged = set()
    for d in domains:
        key = d["domain"]
        if key in skip:
            continue
        bad = [r for r in rows
               if r["energy"].get(key, {}).get("below_zero") == noise_floor.BEYOND_NOISE]
        if not bad:
            continue
        worst = min(bad, key=lambda r: min(r["energy"][key]["raw_above_idle_J"],
                                           r["energy"][key]["raw_self_J"]))
        e = worst["energy"][key]
        depth = -min(e["raw_above_idle_J"], e["raw_self_J"])
        d["unreliable"].append(
            f"{len(bad)} {name[:-1] if len(bad) == 1 else name} came out below the idle "
            f"baseline by more than {'its' if len(bad) == 1 else 'their'} noise "
            f"(most: {worst[label]}, by {scaled(depth, 'J')}, noise ± "
            f"{scaled(e['uncertainty_J'], 'J')}): the idle baseline was "
            "higher than this domain's level while they ran (other load during the baseline, "
            "or an idle level that drifted), so their figures are not shown")
        d["reliable"] = False
        flagged.add(key)
    return flagged


def cross_domain(energy: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The sum over additive domains (package, DRAM, GPUs), `estimated` if any part is; of the
    parts' raw estimates (a part never floored, such as the live view's, as it is), never shown
    below zero (`noise_floor`), and never "below idle" when no part is (parts each zero within
    their noise add to zero: the 3σ of a sum is less than the sum of the parts' 3σ)."""
    parts = {d: e for d, e in energy.items() if _addable(d.partition("@")[0])}
    if not parts:
        return {"above_idle_J": math.nan, "uncertainty_J": math.nan, "total_J": math.nan,
                "provenance": None, "domains": []}
    estimated = any(e["provenance"] != "measured" for e in parts.values())
    raw = float(sum(e.get("raw_above_idle_J", e["above_idle_J"]) for e in parts.values()))
    sigma = math.sqrt(sum(finite_or_zero(e["uncertainty_J"]) ** 2 for e in parts.values()))
    state = noise_floor.below_zero(raw, sigma)
    if state == noise_floor.BEYOND_NOISE and not any(
            noise_floor.below_zero(e.get("raw_above_idle_J", e["above_idle_J"]),
                                   finite_or_zero(e["uncertainty_J"])) == noise_floor.BEYOND_NOISE
            for e in parts.values()):
        state = noise_floor.WITHIN_NOISE  # parts each zero within noise add to zero, not less
    return {
        "above_idle_J": {None: raw, noise_floor.WITHIN_NOISE: 0.0}.get(state, math.nan),
        "raw_above_idle_J": raw,
        "below_zero": state,
        "uncertainty_J": sigma,
        "total_J": float(sum(e["total_J"] for e in parts.values())),
        "provenance": "estimated" if estimated else "measured",
        "domains": sorted(parts),
    }


def _memory_row(calls: dict[str, Any], idx: np.ndarray) -> dict[str, float]:
    """Per group, for RSS (rss_*) and GPU memory (gpu_mem_*): the peak the process reached,
    the mean memory a call retains (delta), the peak above the level the call started at (max
    and mean over calls) and the transient part (peak above both its start and end level), over
    the calls the gauge resolves; below_resolution_share: the calls it does not
    (`below_gauge_resolution`), which have no figure of their own. delta_mean_B leaves out each
    site's first call in each process (`first_of_site`) when later calls exist: first-use work
    (imports, caches) is first_call_delta_mean_B's."""
    def nanmax(a: np.ndarray) -> float:
        a = a[np.isfinite(a)]
        return float(a.max()) if a.size else math.nan

    def nanmean(a: np.ndarray) -> float:
        a = a[np.isfinite(a)]
        return float(a.mean()) if a.size else math.nan

    out = {}
    for key in ("rss", "gpu_mem"):
        start, end, peak = (calls[f"{key}_{c}_B"][idx] for c in ("start", "end", "peak"))
        unresolved = calls[f"{key}_below_resolution"][idx]
        out[f"{key}_below_resolution_share"] = float(unresolved.mean()) if idx.size else math.nan
        # a call the gauge cannot resolve has no memory figure of its own (its neighbours'
        # samples); the process's peak still counts it
        start, end = np.where(unresolved, np.nan, start), np.where(unresolved, np.nan, end)
        own_peak = np.where(unresolved, np.nan, peak)
        first = calls["first_use"][idx]
        kept = end - start
        # first-use work (imports, caches) lands on a site's first call: a call that others
        # follow is the API's typical call, the first calls' own figure stands beside it
        later = kept[~first] if np.isfinite(kept[~first]).any() else kept
        out.update({
            f"{key}_first_call_delta_mean_B": nanmean(kept[first]),
            # the process's highest level during the calls (every API shares the same process)
            f"{key}_peak_max_B": nanmax(peak),
            # what a call leaves behind (retained), and how far above its starting level it
            # went while it ran (its own working memory, transient part included)
            f"{key}_delta_mean_B": nanmean(later),
            f"{key}_peak_above_start_max_B": nanmax(own_peak - start),
            f"{key}_peak_above_start_mean_B": nanmean(own_peak - start),
            f"{key}_transient_mean_B": nanmean(own_peak - np.maximum(start, end)),
        })
    return out


def lead_domain(domains: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first reliable measured domain, else the first reliable one (on a busy machine the
    program's own share leads): what tables are ranked by and data-size energies are fitted in."""
    ranked = sorted(domains, key=lambda d: (not d.get("reliable", True),
                                            d["provenance"] != "measured", d["domain"]))
    return ranked[0] if ranked else None


def _sort_key(domains: list[dict[str, Any]]) -> Callable[[dict[str, Any]], float]:
    """Rows by above-idle energy of the lead domain (`lead_domain`); a figure not shown (below
    zero beyond noise) last."""
    lead = lead_domain(domains)
    first = lead["domain"] if lead else None

    def key(row: dict[str, Any]) -> float:
        value = row["energy"][first]["above_idle_J"] if first else row["total_time_s"]
        return value if math.isfinite(value) else -math.inf

    return key


def _per_rep(
    calls: dict[str, Any], reps: list[dict[str, Any]], domains: dict[str, dict[str, Any]],
    rep_energy: dict[str, list[dict[str, float]]],
) -> list[dict[str, Any]]:
    """Per repetition: duration, and per domain the sensor's energy in the repetition, the part
    inside calls (top-level calls, so nesting is not counted twice) and the tail."""
    top = calls["parent"] < 0
    rows = []
    for i, r in enumerate(reps):
        mine = calls["rep"] == r["rep"]
        row: dict[str, Any] = {"rep": r["rep"], "exit_code": r.get("exit_code"),
                               "duration_s": _span_s(r.get("t_start_ns"), r.get("t_end_ns")),
                               "calls": int(mine.sum()), "energy": {}}
        for domain, info in domains.items():
            row["energy"][domain] = {
                "in_calls_J": float(calls["energy_J"][domain][mine & top].sum()),
                "provenance": info["provenance"], **rep_energy[domain][i],
            }
        rows.append(row)
    return rows


def _span_s(a: int | None, b: int | None) -> float:
    return (b - a) / at.NS if a is not None and b is not None else math.nan


def _sensor_rows(
    sensors: list[dict[str, Any]], details: dict[str, Any], chosen: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    used = {s["name"] for s in chosen.values()}
    return [{**s, **{k: v for k, v in (details.get(s["name"]) or {}).items() if k not in s},
             "attributed": s["name"] in used} for s in sensors]


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


# -- export -----------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON-ready: numpy → Python, NaN/inf → None."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist())
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.bool_):
        return bool(value)
    return value


_ID_COLUMNS = {
    "api": ("api", "written", "sites"),
    "site": ("key", "api", "written", "file", "line", "col", "kind", "function", "source"),
}
_ENERGY_COLUMNS = ("above_idle_J", "below_zero", "total_J", "self_J", "uncertainty_J", "share",
                   "inclusive_share", "below_resolution_share", "rep_mean_J", "rep_ci95_low",
                   "rep_ci95_high", "provenance", "model", "method")
_PER_CALL_COLUMNS = ("mean", "median", "stdev", "ci95_low", "ci95_high")
_MEMORY_COLUMNS = ("rss_peak_max_B", "rss_delta_mean_B", "rss_peak_above_start_max_B",
                   "rss_transient_mean_B", "rss_below_resolution_share",
                   "rss_first_call_delta_mean_B", "gpu_mem_peak_max_B",
                   "gpu_mem_delta_mean_B", "gpu_mem_peak_above_start_max_B",
                   "gpu_mem_transient_mean_B", "gpu_mem_below_resolution_share",
                   "gpu_mem_first_call_delta_mean_B")


def _table_csv(rows: list[dict[str, Any]], kind: str, mode: str) -> str:
    """One row per API / site; `run_mode` (quick or careful, `run_mode`) on every row, so that
    rough figures stay marked wherever the file goes."""
    domains = sorted({d for r in rows for d in r["energy"]})
    header = [*_ID_COLUMNS[kind], "calls", "raised", "total_time_s", "mean_time_s"]
    for d in domains:
        header += [f"{d} {c}" for c in _ENERGY_COLUMNS]
        header += [f"{d} per_call_{c}_J" for c in _PER_CALL_COLUMNS]
    header += ["all_domains_above_idle_J", "all_domains_provenance", *_MEMORY_COLUMNS,
               "run_mode"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    for r in rows:
        line = [";".join(r[c]) if isinstance(r[c], list) else r[c] for c in _ID_COLUMNS[kind]]
        line += [r["calls"], r["raised"], r["total_time_s"], r["mean_time_s"]]
        for d in domains:
            e = r["energy"].get(d, {})
            line += [e.get(c, "") for c in _ENERGY_COLUMNS]
            line += [e.get("per_call", {}).get(c, "") for c in _PER_CALL_COLUMNS]
        line += [r["all_domains"]["above_idle_J"], r["all_domains"]["provenance"],
                 *(r["memory"][c] for c in _MEMORY_COLUMNS), mode]
        writer.writerow(["" if isinstance(x, float) and not math.isfinite(x) else x
                         for x in line])
    return buf.getvalue()
