"""Memory per call: the RSS and GPU-memory gauges read at each call's start and end and their
peak in between, which calls a gauge cannot resolve, and the per-group memory figures."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import pieces
from fecomlite.analysis.sensors_baseline import read_samples
from fecomlite.store import Store
from fecomlite.store.reads import dense_ranks, row_codes

RSS_SENSOR = "proc:rss"
GPU_MEMORY_DOMAINS = ("process-gpu-memory", "gpu-memory")  # preferred first, then gpu:N gauges
# The memory columns of `call_memory` (and first_use) without a call: a streamed run's
EMPTY_CALL_MEMORY = {
    **{f"{g}_{c}_B": np.zeros(0) for g in ("rss", "gpu_mem") for c in ("start", "end", "peak")},
    "rss_below_resolution": np.zeros(0, bool), "gpu_mem_below_resolution": np.zeros(0, bool),
    "first_use": np.zeros(0, bool),
}
MEMORY_COLUMNS = tuple(EMPTY_CALL_MEMORY)  # the per-call columns `memory_row` reads


def sample_positions(t: np.ndarray, t0: np.ndarray, t1: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(samples at or before each start, samples before each end) of a gauge sampled at `t`:
    what `gauge_during` and `below_gauge_resolution` both search, found once for both."""
    return np.searchsorted(t, t0, "right"), np.searchsorted(t, t1, "left")


def gauge_during(
    t: np.ndarray, v: np.ndarray, t0: np.ndarray, t1: np.ndarray,
    at: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value at start, value at end, peak) of a gauge for each [t0, t1]: the last sample at or
    before the start (what the call started with) and the first at or after the end (what it
    left behind), each the nearest other sample when there is none; the peak is the maximum of
    the samples inside plus those two (a short call between two samples gets its neighbours).
    at: `sample_positions`, when known."""
    n = t.size
    if n == 0:
        nan = np.full(t0.size, np.nan)
        return nan, nan.copy(), nan.copy()
    right0, left1 = at or sample_positions(t, t0, t1)
    before0 = np.clip(right0 - 1, 0, n - 1)
    after1 = np.clip(left1, 0, n - 1)
    lo, hi = before0, np.maximum(after1, before0) + 1
    idx = np.empty(2 * lo.size, np.int64)
    idx[0::2], idx[1::2] = lo, hi
    peak = np.maximum.reduceat(np.append(v, v[-1]), idx)[0::2] if idx.size else np.zeros(0)
    return v[before0], v[after1], peak


@dataclass
class Gauges:
    """The memory gauges the figures read: the process's RSS (or None) and its GPU memory,
    one series per GPU (summed), each as (t_ns, bytes); used: which sensor gave each."""

    rss: tuple[np.ndarray, np.ndarray] | None
    gpu: list[tuple[np.ndarray, np.ndarray]]
    used: dict[str, str]


def memory_gauges(store: Store, sensors: list[dict[str, Any]]) -> Gauges:
    """The memory gauges (`gauge_sensors`), read whole (they are sampled, not per call)."""
    rss, gpu, used = gauge_sensors(sensors)
    return Gauges(read_samples(store, rss["id"]) if rss is not None else None,
                  [read_samples(store, s["id"]) for s in gpu], used)


def gauge_sensors(sensors: list[dict[str, Any]]) -> tuple[
        dict[str, Any] | None, list[dict[str, Any]], dict[str, str]]:
    """(the RSS gauge: proc:rss, else the process-memory gauge that is not a peak; the GPU
    memory gauges, `_gpu_memory_sensors`; which sensor gives each)."""
    used: dict[str, str] = {}
    rss = next((s for s in sensors if s["name"] == RSS_SENSOR), None)
    if rss is None:
        rss = next((s for s in sensors if s["domain"] == "process-memory"
                    and s["kind"] == "gauge" and "peak" not in s["name"]), None)
    if rss is not None:
        used["rss"] = rss["name"]
    gpu = _gpu_memory_sensors(sensors)
    if gpu:
        used["gpu_memory"] = ", ".join(s["name"] for s in gpu)
    return rss, gpu, used


def calls_memory(gauges: Gauges, t0: np.ndarray, t1: np.ndarray) -> dict[str, np.ndarray]:
    """RSS and GPU memory columns of calls: start, end and peak levels (NaN without a gauge),
    and whether the gauge resolves each call."""
    cols: dict[str, np.ndarray] = {}
    nan = np.broadcast_to(np.nan, t0.shape)  # a gauge the run lacks: read-only, no memory
    unresolved = np.ones(t0.size, bool)
    if gauges.rss is not None:
        t, v = gauges.rss
        at = sample_positions(t, t0, t1)
        start, end, peak = gauge_during(t, v, t0, t1, at)
        unresolved = below_gauge_resolution(t, t0, t1, at)
    else:
        start, end, peak = nan, nan, nan
    cols.update(rss_start_B=start, rss_end_B=end, rss_peak_B=peak,
                rss_below_resolution=unresolved)
    parts = [gauge_during(t, v, t0, t1) for t, v in gauges.gpu]
    for i, name in enumerate(("gpu_mem_start_B", "gpu_mem_end_B", "gpu_mem_peak_B")):
        cols[name] = np.sum([p[i] for p in parts], axis=0) if parts else nan
    cols["gpu_mem_below_resolution"] = np.any(
        [below_gauge_resolution(t, t0, t1) for t, _ in gauges.gpu], axis=0) if gauges.gpu else (
        np.ones(t0.size, bool))
    return cols


def call_memory(
    store: Store, sensors: list[dict[str, Any]], t0: np.ndarray, t1: np.ndarray
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """RSS and GPU memory columns per call, and which sensor gave each (empty when none)."""
    gauges = memory_gauges(store, sensors)
    return calls_memory(gauges, t0, t1), gauges.used


def first_of_site(
    rep: np.ndarray, pid: np.ndarray, site: np.ndarray, status: np.ndarray
) -> np.ndarray:
    """Each site's first call in each process of each repetition (events in start order): where
    first-use work lands (imports, caches, lazy initialisation), which later calls do not do."""
    out = np.zeros(rep.size, bool)
    heads = np.flatnonzero(pieces.is_call(status))
    if heads.size:
        keys = (rep, pid, site) if heads.size == rep.size else (  # no call in pieces
            rep[heads], pid[heads], site[heads])
        distinct, which = dense_ranks(row_codes(*keys))
        first = np.full(distinct, heads.size)
        np.minimum.at(first, which, np.arange(heads.size))  # each triple's first call
        out[heads[first]] = True
    return out


def below_gauge_resolution(t: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                           at: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
    """Calls a memory gauge cannot resolve: shorter than its sampling period (the median gap
    between its samples), or with no sample inside. Such a call's start and end levels are its
    neighbours' too (two short calls in one gap would both be given the gap's drop), so it
    gets no memory figure of its own. at: `sample_positions`, when known."""
    if t.size < 2:
        return np.ones(t0.size, bool)
    period_ns = float(np.median(np.diff(t)))
    right0, left1 = at or sample_positions(t, t0, t1)
    inside = left1 - right0
    return (inside <= 0) | ((t1 - t0) < period_ns)


def _gpu_memory_sensors(sensors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The process's GPU memory per GPU where known, else the devices' memory in use."""
    gauges = [s for s in sensors if s["kind"] == "gauge" and s["unit"] == "B"]
    for domain in GPU_MEMORY_DOMAINS:
        found = [s for s in gauges if s["domain"] == domain]
        if found:
            return found
    return [s for s in gauges if s["domain"].startswith("gpu:")]


def memory_row(calls: dict[str, Any], idx: np.ndarray | slice) -> dict[str, float]:
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
        out[f"{key}_below_resolution_share"] = (float(unresolved.mean()) if unresolved.size
                                                 else math.nan)
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
