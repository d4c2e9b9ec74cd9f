"""Memory per call streamed over a run's batches: `call_memory.memory_row`'s figures from sums,
counts and maxima per site that merge over batches.

Why: each figure is a mean or a maximum over a group's calls of what the gauges read at the
call's start, end and in between (`call_memory.calls_memory`, per call, needing only the call
and the gauges' series), so it merges; which call is a site's first in its process
(`call_memory.first_of_site`) needs only the (repetition, process, site) triples seen so far.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from fecomlite.analysis.call_memory import Gauges, calls_memory
from fecomlite.runtime.batch_codec import CONTINUES

KEYS = ("rss", "gpu_mem")
# per site and gauge: (sum, count) of each mean's finite values, the maxima
_MEANS = ("first_delta", "later_delta", "any_delta", "above_start", "transient")
_MAXIMA = ("peak", "above_start")


class MemorySums:
    """Per-site memory sums of the calls added so far (`add`, new calls in start order)."""

    def __init__(self, gauges: Gauges, n_sites: int) -> None:
        self.gauges = gauges
        self.n = n_sites
        self.seen: set[tuple[int, ...]] = set()  # (repetition, process, site)
        self.calls = np.zeros(n_sites)
        self.sums = {k: {m: (np.zeros(n_sites), np.zeros(n_sites)) for m in _MEANS}
                     for k in KEYS}
        self.maxima = {k: {m: np.full(n_sites, -np.inf) for m in _MAXIMA} for k in KEYS}
        self.unresolved = {k: np.zeros(n_sites) for k in KEYS}

    def _first(self, site: np.ndarray, rep: np.ndarray, pid: np.ndarray,
               status: np.ndarray) -> np.ndarray:
        """Each site's first call in each process of each repetition, carried over batches."""
        out = np.zeros(site.size, bool)
        heads = np.flatnonzero((status & CONTINUES) == 0)
        if not heads.size:
            return out
        r, p, s = (a[heads].astype(np.int64) for a in (rep, pid, site))
        keys: Iterable[tuple[int, ...]]
        if r.max() < 1 << 21 and p.min() >= 0 and p.max() < 1 << 22 and s.max() < 1 << 20:
            # one integer per (repetition, process, site): a 1-D sort, not one over rows (10x)
            packed, first = np.unique((r << 42) | (p << 20) | s, return_index=True)
            keys = zip((packed >> 42).tolist(), ((packed >> 20) & ((1 << 22) - 1)).tolist(),
                       (packed & ((1 << 20) - 1)).tolist(), strict=True)
        else:
            rows, first = np.unique(np.stack((r, p, s), axis=1), axis=0, return_index=True)
            keys = map(tuple, rows.tolist())
        for key, i in zip(keys, first.tolist(), strict=True):
            if key not in self.seen:
                self.seen.add(key)
                out[heads[i]] = True
        return out

    def add(self, site: np.ndarray, rep: np.ndarray, pid: np.ndarray, status: np.ndarray,
            t0: np.ndarray, t1: np.ndarray) -> None:
        cols = calls_memory(self.gauges, t0, t1)
        first = self._first(site, rep, pid, status)
        self.calls += np.bincount(site, minlength=self.n)
        for key in KEYS:
            start, end, peak = (cols[f"{key}_{c}_B"] for c in ("start", "end", "peak"))
            unresolved = cols[f"{key}_below_resolution"]
            self.unresolved[key] += np.bincount(site, unresolved, self.n)
            start, end = np.where(unresolved, np.nan, start), np.where(unresolved, np.nan, end)
            own_peak = np.where(unresolved, np.nan, peak)
            kept = end - start
            values = {"first_delta": np.where(first, kept, np.nan),
                      "later_delta": np.where(first, np.nan, kept), "any_delta": kept,
                      "above_start": own_peak - start,
                      "transient": own_peak - np.maximum(start, end)}
            for name, v in values.items():
                ok = np.isfinite(v)
                total, count = self.sums[key][name]
                total += np.bincount(site[ok], v[ok], self.n)
                count += np.bincount(site[ok], minlength=self.n)
            for name, v in (("peak", peak), ("above_start", own_peak - start)):
                ok = np.isfinite(v)
                np.maximum.at(self.maxima[key][name], site[ok], v[ok])

    def row(self, members: np.ndarray) -> dict[str, float]:
        """`call_memory.memory_row` of the calls of the sites `members`."""
        def mean(key: str, name: str) -> float:
            total, count = (a[members].sum() for a in self.sums[key][name])
            return float(total / count) if count else math.nan

        def top(key: str, name: str) -> float:
            value = float(self.maxima[key][name][members].max()) if members.size else -np.inf
            return value if math.isfinite(value) else math.nan

        calls = float(self.calls[members].sum())
        out: dict[str, Any] = {}
        for key in KEYS:
            later = ("later_delta" if self.sums[key]["later_delta"][1][members].sum()
                     else "any_delta")
            out.update({
                f"{key}_below_resolution_share":
                    float(self.unresolved[key][members].sum() / calls) if calls else math.nan,
                f"{key}_first_call_delta_mean_B": mean(key, "first_delta"),
                f"{key}_peak_max_B": top(key, "peak"),
                f"{key}_delta_mean_B": mean(key, later),
                f"{key}_peak_above_start_max_B": top(key, "above_start"),
                f"{key}_peak_above_start_mean_B": mean(key, "above_start"),
                f"{key}_transient_mean_B": mean(key, "transient"),
            })
        return out
