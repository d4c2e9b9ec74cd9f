"""Memory per call streamed over a run's batches: `call_memory.memory_row`'s figures from sums,
counts and maxima per site that merge over batches.

Why: each figure is a mean or a maximum over a group's calls of what the gauges read at the
call's start, end and in between (`call_memory.calls_memory`, per call, needing only the call
and the gauges' series), so it merges; which call is a site's first in its process
(`call_memory.first_of_site`) needs only the (repetition, process, site) triples seen so far.
The gauges are read a window at a time (`GaugeWindow`): a day of 200 Hz RSS is 17 M samples.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fecomlite.analysis.call_memory import gauge_sensors
from fecomlite.runtime.batch_codec import CONTINUES
from fecomlite.store import Store

KEYS = ("rss", "gpu_mem")
# per site and gauge: (sum, count) of each mean's finite values, the maxima
_MEANS = ("first_delta", "later_delta", "above_start", "transient")  # every call's: first + later
_MAXIMA = ("peak", "above_start")
WINDOW = 65_536  # a gauge's samples held at a time (1 MB)


class MemorySums:
    """Per-site memory sums of the calls added so far (`add`, new calls in start order)."""

    def __init__(self, gauges: dict[str, list[GaugeWindow]], n_sites: int) -> None:
        self.gauges = gauges  # per key (`KEYS`), its gauges (several GPUs' are summed)
        self.n = n_sites
        self.seen: dict[tuple[int, int], np.ndarray] = {}  # (repetition, process): sites called
        self.calls = np.zeros(n_sites)
        self.sums = {k: {m: (np.zeros(n_sites), np.zeros(n_sites)) for m in _MEANS}
                     for k in KEYS}
        self.maxima = {k: {m: np.full(n_sites, -np.inf) for m in _MAXIMA} for k in KEYS}
        self.unresolved = {k: np.zeros(n_sites) for k in KEYS}

    def _first(self, site: np.ndarray, rep: np.ndarray, pid: np.ndarray,
               status: np.ndarray) -> np.ndarray:
        """Each site's first call in each process of each repetition, carried over batches."""
        out = np.zeros(site.size, bool)
        heads = (status & CONTINUES) == 0
        left = np.arange(site.size)
        while left.size:  # a few processes: a mask of the sites each has called
            key = (int(rep[left[0]]), int(pid[left[0]]))
            mine = (rep[left] == key[0]) & (pid[left] == key[1])
            seen = self.seen.setdefault(key, np.zeros(self.n, bool))
            idx = left[mine]
            new = idx[heads[idx] & ~seen[site[idx]]]
            if new.size:
                sites, first = np.unique(site[new], return_index=True)
                out[new[first]] = True
                seen[sites] = True
            left = left[~mine]
        return out

    def _gauge(self, key: str, t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, ...] | None:
        """(start, end, peak, unresolved) of one gauge key (`call_memory.calls_memory`), None
        without a gauge."""
        series = self.gauges.get(key, [])
        if not series:
            return None
        parts = [g.during(t0, t1) for g in series]
        if len(parts) == 1:
            return parts[0]
        start, end, peak = (np.sum([p[i] for p in parts], axis=0) for i in range(3))
        return start, end, peak, np.any([p[3] for p in parts], axis=0)

    def add(self, site: np.ndarray, rep: np.ndarray, pid: np.ndarray, status: np.ndarray,
            t0: np.ndarray, t1: np.ndarray) -> None:
        first = self._first(site, rep, pid, status)
        self.calls += np.bincount(site, minlength=self.n)
        for key in KEYS:
            found = self._gauge(key, t0, t1)
            if found is None:  # no gauge: every call unresolved, no figure
                self.unresolved[key] += np.bincount(site, minlength=self.n)
                continue
            start, end, peak, unresolved = found
            self.unresolved[key] += np.bincount(site, unresolved, self.n)
            ok = ~unresolved
            s, start, end, own_peak = site[ok], start[ok], end[ok], peak[ok]
            kept, above = end - start, own_peak - start
            f = first[ok]
            values = {"first_delta": (s[f], kept[f]), "later_delta": (s[~f], kept[~f]),
                      "above_start": (s, above),
                      "transient": (s, own_peak - np.maximum(start, end))}
            finite = bool(np.isfinite(start).all() and np.isfinite(end).all()
                          and np.isfinite(own_peak).all())  # the gauges' usual case: no masks
            for name, (where, v) in values.items():
                if not finite:
                    fin = np.isfinite(v)
                    where, v = where[fin], v[fin]
                total, count = self.sums[key][name]
                total += np.bincount(where, v, self.n)
                count += np.bincount(where, minlength=self.n)
            for name, (where, v) in (("peak", (site, peak)), ("above_start", (s, above))):
                fin = np.isfinite(v)
                np.maximum.at(self.maxima[key][name], where[fin], v[fin])

    def row(self, members: np.ndarray) -> dict[str, float]:
        """`call_memory.memory_row` of the calls of the sites `members`."""
        def mean(key: str, *names: str) -> float:
            total = sum(self.sums[key][n][0][members].sum() for n in names)
            count = sum(self.sums[key][n][1][members].sum() for n in names)
            return float(total / count) if count else math.nan

        def top(key: str, name: str) -> float:
            value = float(self.maxima[key][name][members].max()) if members.size else -np.inf
            return value if math.isfinite(value) else math.nan

        calls = float(self.calls[members].sum())
        out: dict[str, Any] = {}
        for key in KEYS:
            later = (("later_delta",) if self.sums[key]["later_delta"][1][members].sum()
                     else ("first_delta", "later_delta"))  # every call's: first calls only
            out.update({
                f"{key}_below_resolution_share":
                    float(self.unresolved[key][members].sum() / calls) if calls else math.nan,
                f"{key}_first_call_delta_mean_B": mean(key, "first_delta"),
                f"{key}_peak_max_B": top(key, "peak"),
                f"{key}_delta_mean_B": mean(key, *later),
                f"{key}_peak_above_start_max_B": top(key, "above_start"),
                f"{key}_peak_above_start_mean_B": mean(key, "above_start"),
                f"{key}_transient_mean_B": mean(key, "transient"),
            })
        return out


def read_gauges(store: Store, sensors: list[dict[str, Any]]
                ) -> tuple[dict[str, list[GaugeWindow]], dict[str, str]]:
    """The memory gauges `call_memory.memory_gauges` reads, each as a `GaugeWindow`; which
    sensor gives each."""
    rss, gpu, used = gauge_sensors(sensors)
    return ({"rss": [GaugeWindow(store, rss["id"])] if rss is not None else [],
             "gpu_mem": [GaugeWindow(store, s["id"]) for s in gpu]}, used)


class GaugeWindow:
    """One memory gauge as `call_memory.gauge_during` and `below_gauge_resolution` read it,
    held `WINDOW` samples at a time: calls come in start order, so the window moves forward;
    a call that ends past the window (one still open at its last sample: a few) is finished
    from the store (its end's sample, the maximum in between).

    Why: the series grows with the run (a day of 200 Hz RSS: 17 M samples, ~2 GB as Python
    rows, 270 MB as numpy); this holds ~1 MB of it, and the median gap (the gauge's sampling
    period) from one chunked pass, exact, in memory that grows with the distinct gaps only."""

    def __init__(self, store: Store, sensor_id: int, window: int | None = None) -> None:
        self.store, self.id, self.window = store, sensor_id, window or WINDOW
        self.last = store.last_sample(sensor_id)
        self.count, self.period_ns = _median_gap(store, sensor_id)
        self.t = np.zeros(0, np.int64)
        self.v = np.zeros(0)

    def during(self, t0: np.ndarray, t1: np.ndarray) -> tuple[np.ndarray, ...]:
        """(value at start, value at end, peak, unresolved) of calls given in start order."""
        n = t0.size
        if self.last is None:
            nan = np.full(n, np.nan)
            return nan, nan.copy(), nan.copy(), np.ones(n, bool)
        out = (np.empty(n), np.empty(n), np.empty(n), np.empty(n, bool))
        i = 0
        while i < n:
            at_end = self._hold(int(t0[i]))
            j = n if at_end else max(i + 1, i + int(np.searchsorted(t0[i:], self.t[-1], "left")))
            for o, part in zip(out, self._in_window(t0[i:j], t1[i:j], at_end), strict=True):
                o[i:j] = part
            i = j
        return out

    def _hold(self, t0: int) -> bool:
        """Hold the window from the last sample at or before `t0` (the first sample if none);
        whether it reaches the series' last sample."""
        held = self.t.size and self.t[0] <= t0 < self.t[-1]
        if not held:
            start = self.store.sample_before(self.id, t0)
            self.t, self.v = self.store.sample_arrays(self.id, start, limit=self.window)
        assert self.last is not None
        return bool(self.t.size < self.window or self.t[-1] >= self.last[0])

    def _in_window(self, t0: np.ndarray, t1: np.ndarray, at_end: bool) -> tuple[np.ndarray, ...]:
        t, v = self.t, self.v
        m = t.size
        right0 = np.searchsorted(t, t0, "right")
        left1 = np.searchsorted(t, t1, "left")
        before0 = np.clip(right0 - 1, 0, m - 1)
        after1 = np.clip(left1, 0, m - 1)
        past = np.flatnonzero(left1 >= m) if not at_end else np.zeros(0, np.int64)
        start, end = v[before0], v[after1]
        # a call between two neighbouring samples: theirs (an end before the start: the start's)
        peak = np.where(after1 > before0, np.maximum(start, end), start)
        wide = np.flatnonzero(after1 > before0 + 1)  # samples inside: their maximum as well
        if wide.size:
            idx = np.empty(2 * wide.size, np.int64)
            idx[0::2], idx[1::2] = before0[wide], after1[wide] + 1
            peak[wide] = np.maximum.reduceat(np.append(v, v[-1]), idx)[0::2]
        for k in past.tolist():  # open at the window's last sample: finished from the store
            found = self.store.sample_after(self.id, int(t1[k])) or self.last
            assert found is not None
            rest = self.store.max_sample(self.id, int(t[-1]), found[0])
            end[k] = found[1]
            peak[k] = max(float(peak[k]), found[1], -math.inf if rest is None else rest)
        # a call past the window has a sample inside (the window's last): resolved by its length
        unresolved = (np.ones(t0.size, bool) if self.count < 2
                      else ((left1 - right0) <= 0) | ((t1 - t0) < self.period_ns))
        return start, end, peak, unresolved


def _median_gap(store: Store, sensor_id: int) -> tuple[int, float]:
    """(samples, the median gap between consecutive ones in ns, as `np.median(np.diff(t))`
    gives it) from one chunked pass: the gaps counted by value."""
    values, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    previous: np.ndarray | None = None
    total = 0
    for chunk in store.sample_chunks(sensor_id):
        t = chunk["t"]
        total += t.size
        gaps = np.diff(t if previous is None else np.concatenate((previous, t)))
        previous = t[-1:]
        found, found_counts = np.unique(gaps, return_counts=True)
        values, where = np.unique(np.concatenate((values, found)), return_inverse=True)
        counts = np.bincount(where.reshape(-1), np.concatenate((counts, found_counts)),
                             values.size).astype(np.int64)
    if total < 2:
        return total, math.nan
    cum = np.cumsum(counts)
    n = int(cum[-1])
    low = values[np.searchsorted(cum, (n - 1) // 2 + 1)]
    high = values[np.searchsorted(cum, n // 2 + 1)]
    return total, (float(low) + float(high)) / 2
