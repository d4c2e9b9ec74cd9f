"""Energy of the calls folded into per-site time buckets (`fecomlite run --keep`), merged into the
streamed analysis' per-site sums (`streamed_run`).

Why: a run with bounded storage keeps no per-call record past its detail window, only, per
(repetition, process, thread, site, bucket), counts and sums of duration, squared duration, self
time and top-level time (`fecomlite/store/call_buckets.py`). Where in its bucket a folded call
ran is not known, so a bucket's time is taken as spread evenly over the bucket: its calls'
leaf time enters the attribution as that density over the sensor intervals the bucket covers
(`add_time`, before the fit), and their energy is their group's rate integrated against it
(`add_energy`). The intensity fit reads only the intervals no bucket covers (the detail
window's), where the calls' mix varies as it ran. Figures that sum over calls (energy, time,
counts) are then those of the full detail within the redistribution of each bucket's energy
inside its width: the *resolution* the report states. Per-call spreads come from the sums of
squares (each call's energy taken as its bucket's energy per second × its duration); memory
per call exists only for calls kept in detail, and a run with buckets is analysed streamed,
which shows no per-call median nor timeline of calls.

A folded call whose parent was kept in detail (a call as long as a bucket: an epoch, a `fit`)
is found by time: the innermost detailed call of its thread that holds all of a bucket row's
top-level calls. That call's self time and energy leave them out, as they would in detail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis.placed import overlap_matrix
from fecomlite.store import Store
from fecomlite.store.call_buckets import BUSY

NS = at.NS


@dataclass
class FoldedCalls:
    """A run's bucket rows (`call_buckets.KEY` + `FIGURES` columns), each row's site index and
    fit group, and the site index and fit group of the detailed call holding its top-level
    calls (−1 and 0: none, they are top-level); the busy rows (`call_buckets.BUSY`)."""

    rows: dict[str, np.ndarray]
    site: np.ndarray
    group: np.ndarray
    encloser: np.ndarray
    encloser_group: np.ndarray
    busy: dict[str, np.ndarray]  # per repetition and bucket: the union of its folded calls

    @property
    def width_s(self) -> float:
        return float(self.rows["width_ns"].max()) / NS

    @property
    def calls(self) -> int:
        return int(self.rows["calls"].sum())

    def calls_per_site(self, n_sites: int) -> np.ndarray:
        return np.bincount(self.site, self.rows["calls"], n_sites).astype(np.int64)

    def _spread(self, edges: np.ndarray, values_s: np.ndarray, col: np.ndarray | int,
                ncols: int, rows: dict[str, np.ndarray] | None = None) -> np.ndarray:
        """(K, ncols): `values_s` seconds per row (of `rows`, default the calls') spread evenly
        over its bucket, into column `col`."""
        rows = self.rows if rows is None else rows
        b0, width = rows["t0_ns"], rows["width_ns"]
        return overlap_matrix(edges, b0, b0 + width, np.broadcast_to(col, b0.shape),
                                  values_s / (width / NS), ncols)

    def add_time(self, domains: dict[str, Any]) -> None:
        """Before the fit: the folded calls' leaf time into each domain's (`streamed.Domain`);
        the detailed calls around folded ones lose that time from theirs; the time some folded
        call ran is call time, not the program's time between calls."""
        r = self.rows
        self_s, top_s = r["self_ns"] / NS, r["top_ns"] / NS
        held = self.encloser >= 0
        for dom in domains.values():
            edges, ncols = dom.iv.edges_ns, dom.leaf.shape[1]
            dom.leaf += self._spread(edges, self_s, self.group, ncols)
            if held.any():
                dom.leaf -= self._spread(edges, np.where(held, top_s, 0.0),
                                         self.encloser_group, ncols)
            busy = self._spread(edges, self.busy["top_ns"] / NS, 0, 1, self.busy)[:, 0]
            if dom.gaps:
                dom.leaf[:, -1] = np.maximum(dom.leaf[:, -1] - busy, 0.0)
            else:
                dom.union = np.minimum(dom.union + busy, dom.iv.lengths_s)
            np.maximum(dom.leaf, 0.0, out=dom.leaf)
            dom.fit_on = self._detailed(edges)

    def _detailed(self, edges: np.ndarray) -> np.ndarray | None:
        """The intervals no bucket overlaps: the intensity fit reads only those, since a
        bucket's calls, spread evenly, are in the same mix in every interval it covers and
        would tell the fit nothing but that mix (it then leans on the few intervals it can
        tell apart)."""
        covered = self._spread(edges, self.busy["top_ns"] / NS, 0, 1, self.busy)[:, 0] > 0
        return None if covered.all() else ~covered  # none left: the fit reads them all

    def add_energy(self, sums: Any, extra: dict[str, Any], domains: dict[str, Any],
                   rates: dict[str, Any], rep_ids: list[int]) -> None:
        """After sweep 2: the folded calls' counts, times and energies into the per-site sums
        (`streamed.SiteSums`), the repetitions' events and the domains' energy in calls."""
        r, site, n_sites = self.rows, self.site, sums.calls.size
        rep_col = _rep_column(r["rep"], rep_ids)
        ok = rep_col >= 0
        time_s = r["time_ns"] / NS
        sums.calls += np.bincount(site, r["calls"], n_sites)
        sums.pieces += np.bincount(site, r["pieces"], n_sites)
        sums.raised += np.bincount(site, r["raised"], n_sites)
        sums.time_s += np.bincount(site, time_s, n_sites)
        np.add.at(sums.rep_calls, (site[ok], rep_col[ok]), r["calls"][ok])
        for i, n in zip(rep_col[ok], r["pieces"][ok], strict=True):
            extra["rep_events"][i] += int(n)
        for d, dom in domains.items():
            self._domain(sums.energy[d], extra["totals"][d], extra["rep_in_calls"][d],
                         dom, rates[d], rep_col, n_sites)

    def _domain(self, e: dict[str, Any], totals: dict[str, float], rep_in_calls: list[float],
                dom: Any, rt: Any, rep_col: np.ndarray, n_sites: int) -> None:
        r, site = self.rows, self.site
        b0, b1 = r["t0_ns"], r["t0_ns"] + r["width_ns"]
        width = r["width_ns"] / NS
        edges = dom.iv.edges_ns
        rate_of = _integral(edges, rt.rates, rt.cum, b0, b1, self.group) / width  # J per s
        idle_of = _integral(edges, rt.q[:, None], rt.cum_q[:, None], b0, b1, 0) / width
        time_s, self_s, top_s = r["time_ns"] / NS, r["self_ns"] / NS, r["top_ns"] / NS
        inclusive = rate_of * time_s
        e["self"] += np.bincount(site, rate_of * self_s, n_sites)
        e["inclusive"] += np.bincount(site, inclusive, n_sites)
        e["total"] += np.bincount(site, inclusive + idle_of * time_s, n_sites)
        _per_rep(e["per_rep"], site, rep_col, inclusive)
        _merge(e, site, r["pieces"], inclusive, rate_of ** 2 * r["time_sq"], n_sites)
        self._uncertainty(e, dom, rt, n_sites)
        held = self.encloser >= 0
        if held.any():  # the detailed call around them: its self loses them, as in detail
            outer = self.encloser[held]
            outer_rate = _integral(edges, rt.rates, rt.cum, b0[held], b1[held],
                                   self.encloser_group[held]) / width[held]
            e["self"] -= np.bincount(outer, outer_rate * top_s[held], n_sites)
            moved = (rate_of[held] - outer_rate) * top_s[held]
            e["inclusive"] += np.bincount(outer, moved, n_sites)
            e["total"] += np.bincount(outer, moved, n_sites)
            _per_rep(e["per_rep"], outer, rep_col[held], moved)
        free = ~held
        in_calls = rate_of[free] * top_s[free]
        totals["in_calls_J"] += float(in_calls.sum())
        totals["in_calls_total_J"] += float(((rate_of + idle_of) * top_s)[free].sum())
        for i, v in zip(rep_col[free], in_calls, strict=True):
            if i >= 0:
                rep_in_calls[i] += float(v)

    def _uncertainty(self, e: dict[str, Any], dom: Any, rt: Any, n_sites: int) -> None:
        """Sharing and measurement uncertainty as the streamed sweep sums them per call: those
        of one call of the bucket's mean duration in its middle, scaled to its calls (the
        measurement part by Σ d² / mean², as it goes with the square of each call's energy);
        below the sensor's resolution: calls whose bucket's mean duration is shorter than its
        period."""
        r, site = self.rows, self.site
        pieces = np.maximum(r["pieces"], 1)
        mean_ns = r["time_ns"] / pieces
        mid = r["t0_ns"] + r["width_ns"] // 2
        t0 = (mid - mean_ns / 2).astype(np.int64)
        t1 = t0 + mean_ns.astype(np.int64)
        sharing, meas = at._uncertainty(dom.iv, rt.above, rt.h, rt.weights[self.group], t0, t1)
        scale = np.divide(r["time_sq"], (mean_ns / NS) ** 2, out=r["pieces"].astype(float),
                          where=mean_ns > 0)
        e["sharing_abs"] += np.bincount(site, r["pieces"] * np.abs(sharing), n_sites)
        e["meas_sq"] += np.bincount(site, scale * meas ** 2, n_sites)
        e["below"] += np.bincount(site, np.where(mean_ns / NS < dom.iv.period_s,
                                                 r["pieces"], 0), n_sites)

    def note(self, detailed: int) -> str:
        """What the report says of the run's folded calls."""
        total = detailed + self.calls
        share = self.calls / total if total else 0.0
        return (f"bounded storage (--keep): {self.calls:,} of {total:,} calls ({share:.1%}) "
                "were past the detail window and are kept as per-site buckets of "
                f"{_seconds(self.width_s)}: their counts, times and sums are exact, their energy "
                f"is spread evenly over each bucket (resolution {_seconds(self.width_s)}), their "
                "per-call spread comes from sums of squares; memory per call covers only the "
                "calls kept in detail (the first and the latest window of each repetition)")


def mark_bucketed(rows: tuple[list[dict[str, Any]], list[dict[str, Any]]],
                  folded: FoldedCalls, api_of_site: np.ndarray, n_apis: int) -> None:
    """Mark the site and API rows (in site and API order) with how many of their calls come
    from buckets, and the buckets' width: the report shows which figures are bucketed."""
    per_site = folded.calls_per_site(api_of_site.size)
    per_api = np.bincount(api_of_site, per_site, n_apis).astype(np.int64)
    for group_rows, counts in zip(rows, (per_site, per_api), strict=True):
        for row, n in zip(group_rows, counts.tolist(), strict=True):
            row["bucketed_calls"] = int(n)
            row["bucket_s"] = folded.width_s if n else None


def read(store: Store, run_id: int, site_index: Any, site_fit: np.ndarray
         ) -> FoldedCalls | None:
    """The run's folded calls, None when it has none; their enclosing detailed calls found
    with one pass over the detailed chunks (bounded: the detail window's calls)."""
    rows = store.call_buckets(run_id)
    if rows is None:
        return None
    busy = rows["site_id"] == BUSY[2]
    union = {c: v[busy] for c, v in rows.items()}
    rows = {c: v[~busy] for c, v in rows.items()}
    site = site_index(rows["site_id"])
    folded = FoldedCalls(rows, site, site_fit[site], np.full(site.size, -1, np.int64),
                         np.zeros(site.size, np.int64), union)
    enclosers(store, run_id, folded, site_index)
    held = folded.encloser >= 0
    folded.encloser_group[held] = site_fit[folded.encloser[held]]
    return folded


def enclosers(store: Store, run_id: int, folded: FoldedCalls, site_index: Any) -> None:
    """Each row's innermost detailed call of its thread holding all its top-level calls (the
    one of latest start among those that do)."""
    r = folded.rows
    tops = np.flatnonzero(r["top_ns"] > 0)
    if not tops.size:
        return
    best = np.full(r["rep"].size, np.iinfo(np.int64).min)
    by_thread: dict[tuple[int, int, int], list[int]] = {}
    for i in tops.tolist():
        by_thread.setdefault((int(r["rep"][i]), int(r["pid"][i]), int(r["tid"][i])), []).append(i)
    order = {k: np.array(sorted(v, key=lambda i: r["top_first_ns"][i]), np.int64)
             for k, v in by_thread.items()}
    for cols in store.event_chunks(run_id):
        key = (int(cols["rep"][0]), int(cols["pid"][0]))
        for tid in np.unique(cols["tid"]).tolist():
            mine = order.get((*key, int(tid)))
            if mine is None:
                continue
            on = cols["tid"] == tid
            _hold(folded, best, mine, cols["t_start_ns"][on], cols["t_end_ns"][on],
                  site_index(cols["site_id"][on]))


def _hold(folded: FoldedCalls, best: np.ndarray, rows: np.ndarray, t0: np.ndarray,
          t1: np.ndarray, site: np.ndarray) -> None:
    """Mark `rows` (of one thread, by earliest top-level start) held by any of these calls."""
    first = folded.rows["top_first_ns"][rows]
    last = folded.rows["top_last_ns"][rows]
    lo = np.searchsorted(first, t0, "left")
    hi = np.searchsorted(first, t1, "right")
    for c in np.flatnonzero(hi > lo):  # the few calls that start before some row's calls
        for j in range(lo[c], hi[c]):
            i = rows[j]
            if last[j] <= t1[c] and t0[c] > best[i]:
                best[i] = t0[c]
                folded.encloser[i] = site[c]


def _integral(edges: np.ndarray, rates: np.ndarray, cum: np.ndarray, a: np.ndarray,
              b: np.ndarray, g: np.ndarray | int) -> np.ndarray:
    """∫ rates[:, g] over [a, b) (rates constant in each interval; clipped to the intervals)."""
    return _cumulative(edges, rates, cum, b, g) - _cumulative(edges, rates, cum, a, g)


def _cumulative(edges: np.ndarray, rates: np.ndarray, cum: np.ndarray, t: np.ndarray,
                g: np.ndarray | int) -> np.ndarray:
    k = edges.size - 1
    if k <= 0:
        return np.zeros(t.size)
    tc = np.clip(t, edges[0], edges[-1])
    i = np.minimum(np.searchsorted(edges, tc, "right") - 1, k - 1)
    return cum[i, g] + rates[i, g] * (tc - edges[i]) / NS


def _rep_column(reps: np.ndarray, rep_ids: list[int]) -> np.ndarray:
    """Each row's index in `rep_ids` (−1: not a stored repetition)."""
    index = {r: i for i, r in enumerate(rep_ids)}
    return np.array([index.get(int(r), -1) for r in reps], np.int64)


def _per_rep(table: np.ndarray, site: np.ndarray, rep: np.ndarray, values: np.ndarray) -> None:
    ok = rep >= 0
    np.add.at(table, (site[ok], rep[ok]), values[ok])


def _merge(e: dict[str, Any], site: np.ndarray, n: np.ndarray, total: np.ndarray,
           squares: np.ndarray, n_sites: int) -> None:
    """Chan's update of each site's per-call count, mean and M2 with the rows' (count, sum,
    sum of squares)."""
    n_b = np.bincount(site, n, n_sites)
    s_b = np.bincount(site, total, n_sites)
    mean_b = np.divide(s_b, n_b, out=np.zeros(n_sites), where=n_b > 0)
    m2_b = np.maximum(np.bincount(site, squares, n_sites) - n_b * mean_b ** 2, 0.0)
    both = e["n"] + n_b
    delta = mean_b - e["mean"]
    safe = np.where(both > 0, both, 1)
    e["mean"] = np.where(both > 0, e["mean"] + delta * n_b / safe, 0.0)
    e["m2"] = e["m2"] + m2_b + delta ** 2 * e["n"] * n_b / safe
    e["n"] = both


def _seconds(s: float) -> str:
    return f"{s / 60:g} min" if s >= 60 and s % 60 == 0 else f"{s:g} s"
