"""A run's energy attribution streamed over its chunks (`sweep`): the figures `analyse_run` gives
per site, per API and per domain, in memory that does not grow with the run.

Why: the whole-run analysis holds every call's columns (~0.6 GB at 1 M calls), so a day of
training (~90 M calls) cannot be reported. Everything it sums is a sum over calls, and every
per-call figure is known once the call and its descendants have ended; only the sensors' series
(10 Hz power: ~1 M intervals a day) are held whole. Two sweeps over the chunks:

1. per domain, each fit group's leaf time in each sensor interval (`attribution.leaf_time`, one
   batch at a time), the union of the calls and the program's time between calls (the
   `<program outside calls>` activity): from them the fit and each interval's rate per group,
   exactly as `attribution.attribute` computes them;
2. per call, its inclusive energy (above idle, and with its share of idle power) as ∫ rate over
   its span less its children's spans at its own group's rate plus its children's inclusive
   energy (a call still open carries its running sum to the next batch), its sharing and
   measurement uncertainty; merged into per-site sums and per-call moments (`Moments`, the
   pairwise update), per-API ones merged from the sites'.

The per-call part of both sweeps runs in C where it is built (`sweep_fast`, `_sweep.c`); the
numpy sweeps here are the fallback and are held to the same figures. Agreement with
`analyse_run` to float noise is a property test (tests/test_streamed.py). A run
with layer pieces (continuations) is counted by calls, but its per-call energy figures and
raised counts are per piece here (`pieces_note`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import sweep, sweep_fast
from fecomlite.analysis.call_stats import Moments
from fecomlite.analysis.placed import overlap_matrix
from fecomlite.analysis.streamed_memory import MemorySums
from fecomlite.runtime.batch_codec import CONTINUES, RAISED

Chunks = Callable[[], Iterable[dict[str, np.ndarray]]]


@dataclass
class Windows:
    """Each repetition's program window [start, end) (`program_figures.with_program_gaps`: a
    calibration repetition's ends at its first replay), for the time between calls."""

    spans: dict[int, tuple[int, int]]


def _seconds_in(edges: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Seconds of the spans [starts, ends) inside each interval of `edges`."""
    return overlap_matrix(edges, starts, ends, np.zeros(starts.size, np.int64),
                          np.ones(starts.size), 1)[:, 0]


class _Union:
    """The union of spans given in start order, batch by batch: closed segments are added to a
    per-interval vector at once, the open one carried."""

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = edges
        self.seconds = np.zeros(max(edges.size - 1, 0))
        self.open: tuple[int, int] | None = None

    def add(self, t0: np.ndarray, t1: np.ndarray) -> None:
        if not t0.size:
            return
        a, b = t0, np.maximum(t1, t0)
        if self.open is not None:
            a = np.concatenate(([self.open[0]], a))
            b = np.concatenate(([self.open[1]], b))
        b = np.maximum.accumulate(b)
        new = np.concatenate(([True], a[1:] > b[:-1]))
        seg = np.flatnonzero(new)
        starts, ends = a[seg], np.concatenate((b[seg[1:] - 1], b[-1:]))
        self._count(starts[:-1], ends[:-1])
        self.open = (int(starts[-1]), int(ends[-1]))

    def close(self) -> np.ndarray:
        if self.open is not None:
            self._count(np.array([self.open[0]]), np.array([self.open[1]]))
            self.open = None
        return self.seconds

    def _count(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if starts.size:
            self.seconds += _seconds_in(self.edges, starts, ends)


class _Gaps:
    """The program's time between calls (of any thread) inside each repetition's window, as
    `program_figures.program_gaps` finds it, from calls given in start order: summed per
    interval of each set of sensor `edges` as they come (back-to-back calls leave a gap between
    every two: kept whole, the gaps of a 5 M-call run took ~500 MB), with their count and the
    latest end."""

    def __init__(self, windows: Windows, edges: dict[str, np.ndarray]) -> None:
        self.windows = windows
        self.rep: int | None = None
        self.cover = 0
        self.seen: set[int] = set()
        self.edges = edges
        self.seconds = {name: np.zeros(max(e.size - 1, 0)) for name, e in edges.items()}
        self.count = 0
        self.last_end: int | None = None

    def add(self, rep: int, t0: np.ndarray, t1: np.ndarray) -> None:
        if rep != self.rep:
            self.finish()
            self.rep, self.seen = rep, self.seen | {rep}
            self.cover = self.windows.spans[rep][0] if rep in self.windows.spans else 0
        if rep not in self.windows.spans:
            return
        a, b = self.windows.spans[rep]
        inside = (t1 > a) & (t0 < b)
        s, e = np.clip(t0[inside], a, b), np.clip(t1[inside], a, b)
        if s.size:
            prev = np.maximum.accumulate(np.concatenate(([self.cover], e)))
            keep = s > prev[:-1]
            self._count(prev[:-1][keep], s[keep])
            self.cover = int(prev[-1])

    def finish(self) -> None:
        """The last gap of the current repetition's window."""
        if self.rep is None or self.rep not in self.windows.spans:
            return
        b = self.windows.spans[self.rep][1]
        self.rep = None
        if b > self.cover:
            self._count(np.array([self.cover]), np.array([b]))

    def unseen(self) -> None:
        """Whole windows of repetitions without a call."""
        for r, (a, b) in self.windows.spans.items():
            if r not in self.seen and b > a:
                self._count(np.array([a]), np.array([b]))

    def _count(self, g0: np.ndarray, g1: np.ndarray) -> None:
        if not g0.size:
            return
        self.count += int(g0.size)
        end = int(g1.max())
        self.last_end = end if self.last_end is None else max(self.last_end, end)
        for name, edges in self.edges.items():
            self.seconds[name] += _seconds_in(edges, g0, g1)


@dataclass
class Domain:
    """One energy domain as the two sweeps see it: the sensor's intervals, idle and ceiling;
    after sweep 1 the leaf time (K, groups + 1: the last column is the program between calls,
    when `gaps`), the union of the calls (busy) and of the calls with their settle time
    (recent: for an idle level when none was measured), the latest end; then the rates."""

    name: str
    iv: at.SensorIntervals
    idle_W: float | None
    ceiling_W: float
    gaps: bool
    ngroups: int
    leaf: np.ndarray = field(init=False)
    union: np.ndarray = field(init=False)
    t_max: int = 0
    fit: at.IntensityFit | None = None
    method: str = "overlap"
    fell_back: bool = False
    rel_spread: float = at.DEFAULT_REL_SPREAD
    capped: bool = False
    fit_on: np.ndarray | None = None  # the intervals the intensity fit reads (None: all)

    def __post_init__(self) -> None:
        self.leaf = np.zeros((self.iv.count, self.ngroups + 1))


@dataclass
class SiteSums:
    """Per site (arrays over sites; per_rep: sites × repetitions), mergeable over batches."""

    calls: np.ndarray
    pieces: np.ndarray
    raised: np.ndarray
    time_s: np.ndarray
    rep_calls: np.ndarray
    energy: dict[str, dict[str, Any]]


def _zeros_sums(n_sites: int, n_reps: int, domains: list[str]) -> SiteSums:
    def z() -> np.ndarray:
        return np.zeros(n_sites)

    energy = {d: {"inclusive": z(), "total": z(), "self": z(), "sharing_abs": z(), "meas_sq": z(),
                  "below": z(), "per_rep": np.zeros((n_sites, n_reps)),
                  "n": z(), "mean": z(), "m2": z()} for d in domains}
    return SiteSums(z(), z(), z(), z(), np.zeros((n_sites, n_reps)), energy)


def _merge_moments(e: dict[str, Any], site: np.ndarray, values: np.ndarray, n_sites: int) -> None:
    """Chan's pairwise update of each site's per-call count, mean and M2 with a batch's."""
    n_b = np.bincount(site, minlength=n_sites).astype(float)
    s_b = np.bincount(site, values, n_sites)
    mean_b = np.divide(s_b, n_b, out=np.zeros(n_sites), where=n_b > 0)
    m2_b = np.bincount(site, (values - mean_b[site]) ** 2, n_sites)
    n = e["n"] + n_b
    delta = mean_b - e["mean"]
    with np.errstate(invalid="ignore", divide="ignore"):
        e["mean"] = np.where(n > 0, e["mean"] + delta * np.divide(n_b, n, where=n > 0,
                                                                   out=np.zeros(n_sites)), 0.0)
        e["m2"] = e["m2"] + m2_b + np.where(n > 0, delta ** 2 * e["n"] * n_b
                                            / np.where(n > 0, n, 1), 0.0)
    e["n"] = n


def _cumulative(edges: np.ndarray, rates: np.ndarray) -> np.ndarray:
    """(K + 1, groups): ∫ rate from the first edge to each edge."""
    return np.vstack((np.zeros((1, rates.shape[1])),
                      np.cumsum(rates * (np.diff(edges) / at.NS)[:, None], axis=0)))


@dataclass
class Rates:
    """What sweep 2 integrates for one domain: rate per interval and group (above idle), the
    idle share's rate, and the unweighted rate h × the group's weight (for the uncertainty)."""

    rates: np.ndarray
    cum: np.ndarray
    q: np.ndarray
    cum_q: np.ndarray
    h: np.ndarray
    weights: np.ndarray
    above: np.ndarray


def _rates(dom: Domain, method: str) -> Rates:
    """The fit and rates of one domain from its leaf time, as `attribution.attribute` makes
    them; sets the domain's method, fit and whether a ceiling capped some group."""
    iv, lengths = dom.iv, dom.iv.lengths_s
    above = iv.energy_J - dom.idle_W * lengths
    leaf = dom.leaf if dom.gaps else dom.leaf[:, :-1]
    weights = np.ones(leaf.shape[1])
    if method != "overlap":
        on = slice(None) if dom.fit_on is None else dom.fit_on
        dom.fit = at.fit_intensities(leaf[on], above[on], lengths_s=lengths[on],
                                     ceiling_W=dom.ceiling_W)
        if method == "intensity" or dom.fit.supported:
            if dom.fit.pooled_W > 0:
                weights = dom.fit.intensity_W / dom.fit.pooled_W
        else:
            dom.fell_back = True
    dom.method = "intensity" if (method != "overlap" and not dom.fell_back) else "overlap"
    d = leaf @ weights
    h = np.divide(above, d, out=np.zeros_like(above), where=d > 0)
    capped = at.capped_rates(above, leaf, weights, dom.ceiling_W)
    dom.capped = capped is not None
    rates = h[:, None] * weights[None, :] if capped is None else capped
    w = leaf.sum(axis=1)
    q = np.divide(dom.idle_W * dom.union, w, out=np.zeros_like(w), where=w > 0)
    return Rates(rates, _cumulative(iv.edges_ns, rates), q,
                 _cumulative(iv.edges_ns, q[:, None])[:, 0], h, weights, above)


def sweep_one(chunks: Chunks, threads: sweep.Threads, site_fit: np.ndarray,
              site_index: Callable[[np.ndarray], np.ndarray], domains: dict[str, Domain],
              windows: Windows, batch_events: int = sweep.BATCH_EVENTS
              ) -> tuple[int, int] | None:
    """Leaf time, unions and the program's gaps of every domain (sweep 1); the calls' span
    (first start, last end), None without calls."""
    lead: dict[str, str] = {}  # domains read at the same instants: the first one's sums
    for d, dom in domains.items():
        lead[d] = next((e for e in lead.values() if dom.iv.edges_ns.size
                        == domains[e].iv.edges_ns.size and np.array_equal(
                            dom.iv.edges_ns, domains[e].iv.edges_ns)), d)
    leads = [domains[d] for d in dict.fromkeys(lead.values())]
    busy = {dom.name: _Union(dom.iv.edges_ns) for dom in leads}
    recent = {dom.name: _Union(dom.iv.edges_ns) for dom in leads}
    gaps = _Gaps(windows, {dom.name: dom.iv.edges_ns for dom in leads})
    span: list[int] = []  # first start, last end

    def outside(t0: np.ndarray, t1: np.ndarray, rep: int) -> None:
        """The new calls of a batch (in start order) into the unions, gaps and span."""
        if not t0.size:
            return
        for dom in leads:
            busy[dom.name].add(t0, t1)
            if any(domains[d].idle_W is None for d, first in lead.items() if first == dom.name):
                recent[dom.name].add(t0, t1 + int(1.0 * at.NS))
        gaps.add(rep, t0, t1)
        first, last = int(t0.min()), int(t1.max())
        span[:] = [min(span[0], first), max(span[1], last)] if span else [first, last]

    if sweep_fast.available():
        sweep_fast.leaf_sums(chunks, threads, site_fit, site_index, leads, batch_events,
                             outside)
    else:
        _leaf_numpy(chunks, threads, site_fit, site_index, leads, batch_events, outside)
    t_min, t_max = span if span else (None, None)
    gaps.finish()
    gaps.unseen()
    unions = {d: (busy[d].close(), recent[d].close()) for d in busy}
    for d, dom in domains.items():
        if lead[d] != d:
            dom.leaf = domains[lead[d]].leaf.copy()
    for d, dom in domains.items():
        calls_union, recent_union = unions[lead[d]]
        dom.union = calls_union.copy()
        has_gaps = gaps.count > 0 and dom.gaps
        dom.gaps = has_gaps
        if has_gaps:
            gap_time = gaps.seconds[lead[d]]
            dom.leaf[:, -1] += gap_time
            dom.union += gap_time
        ends = [t for t in (t_max, gaps.last_end if has_gaps else None) if t is not None]
        dom.t_max = max(ends) if ends else int(dom.iv.edges_ns[0])
        if dom.idle_W is None:
            dom.idle_W = _quiet_idle(dom.iv, calls_union, recent_union)
    return None if t_min is None or t_max is None else (t_min, t_max)


def _leaf_numpy(chunks: Chunks, threads: sweep.Threads, site_fit: np.ndarray,
                site_index: Callable[[np.ndarray], np.ndarray], leads: list[Domain],
                batch_events: int, outside: Callable[[np.ndarray, np.ndarray, int], None]
                ) -> None:
    """Sweep 1's leaf time in numpy, batch by batch (`sweep_fast` does it in C)."""
    for b in sweep.batches(chunks(), threads, batch_events):
        cols = b.columns
        new = slice(b.carried, None)
        t0, t1 = cols["t_start_ns"][new], np.maximum(cols["t_end_ns"], cols["t_start_ns"])[new]
        grp = site_fit[site_index(cols["site_id"])]
        parent = b.parent[new]
        child = parent >= 0
        s0 = np.concatenate((t0, t0[child]))
        s1 = np.concatenate((t1, t1[child]))
        col = np.concatenate((grp[new], grp[parent[child]]))
        w = np.concatenate((np.ones(t0.size), -np.ones(int(child.sum()))))
        for dom in leads:
            dom.leaf += overlap_matrix(dom.iv.edges_ns, s0, s1, col, w, dom.ngroups + 1)
        outside(t0, t1, int(cols["rep"][b.carried]) if t0.size else 0)


def _quiet_idle(iv: at.SensorIntervals, busy: np.ndarray, recent: np.ndarray) -> float:
    """`attribution.estimate_idle_W` from the unions of sweep 1."""
    if iv.count == 0:
        return float("nan")
    a, b = iv.edges_ns[:-1], iv.edges_ns[1:]
    quiet = (busy == 0) & (recent == 0) & (b > a)
    if quiet.sum() >= 3:
        return float(np.median(iv.power_W[quiet]))
    return float(np.percentile(iv.power_W, 5))


def sweep_two(chunks: Chunks, threads: sweep.Threads, site_fit: np.ndarray,
              site_index: Callable[[np.ndarray], np.ndarray], domains: dict[str, Domain],
              rates: dict[str, Rates], reps: list[int], memory: MemorySums,
              batch_events: int = sweep.BATCH_EVENTS) -> tuple[SiteSums, dict[str, Any]]:
    """Every call's energies and memory figures merged per site, and the domains' in-call sums
    (sweep 2)."""
    state = _SweepTwo(site_fit, domains, rates, reps, memory)
    if sweep_fast.available():
        extra = sweep_fast.energy_sums(chunks, threads, site_fit, site_index, domains, rates,
                                       state.sums, state.rep_col, memory, batch_events)
        return state.sums, extra
    for b in sweep.batches(chunks(), threads, batch_events):
        state.add(_View.of(b, site_index(b.columns["site_id"]), site_fit, state.rep_col))
    return state.sums, {"totals": state.totals, "pieces": state.pieces,
                        "rep_events": state.rep_events.tolist(),
                        "rep_in_calls": {d: v.tolist() for d, v in state.rep_in_calls.items()}}


@dataclass
class _View:
    """One batch as sweep 2 reads it: each call's site, fit group, start and end (never before
    its start), repetition column (−1: not a stored repetition); the new calls, the new calls
    with a parent and their parents, depths within the batch, the calls closed after it."""

    b: sweep.Batch
    site: np.ndarray
    grp: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    rep_of: np.ndarray
    new: np.ndarray
    child: np.ndarray
    par: np.ndarray
    depth: np.ndarray
    closed: np.ndarray

    @classmethod
    def of(cls, b: sweep.Batch, site: np.ndarray, site_fit: np.ndarray,
           rep_col: dict[int, int]) -> _View:
        cols = b.columns
        t0 = cols["t_start_ns"]
        seen = np.unique(cols["rep"])
        rep_of = np.array([rep_col.get(int(r), -1) for r in seen], np.int64)[
            np.searchsorted(seen, cols["rep"])]
        new = np.arange(b.carried, b.size)
        child = new[b.parent[new] >= 0]
        return cls(b, site, site_fit[site], t0, np.maximum(cols["t_end_ns"], t0), rep_of, new,
                   child, b.parent[child], at._depths(b.parent), np.flatnonzero(b.closed))


class _SweepTwo:
    """Sweep 2's sums, batch by batch; `carried`: per domain, the open calls' running inclusive
    energy above idle and idle share."""

    def __init__(self, site_fit: np.ndarray, domains: dict[str, Domain],
                 rates: dict[str, Rates], reps: list[int], memory: MemorySums) -> None:
        self.n_sites, self.n_reps = site_fit.size, len(reps)
        self.domains, self.rates, self.memory = domains, rates, memory
        self.sums = _zeros_sums(self.n_sites, self.n_reps, list(domains))
        self.rep_col = {r: i for i, r in enumerate(reps)}
        self.totals = {d: {"in_calls_J": 0.0, "in_calls_total_J": 0.0} for d in domains}
        self.rep_in_calls = {d: np.zeros(self.n_reps) for d in domains}
        self.rep_events = np.zeros(self.n_reps, np.int64)
        self.carried: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.pieces = False

    def add(self, v: _View) -> None:
        cols, new = v.b.columns, v.new
        status = cols["status"][new]
        counted = v.rep_of[new] >= 0
        self.rep_events += np.bincount(v.rep_of[new][counted], minlength=self.n_reps)
        self.pieces = self.pieces or bool((status & CONTINUES).any())
        _count_calls(self.sums, v.site[new], status, v.t1[new] - v.t0[new], v.rep_of[new],
                     self.n_sites)
        self.memory.add(v.site[new], cols["rep"][new], cols["pid"][new], status, v.t0[new],
                        cols["t_end_ns"][new])
        lookups: dict[bytes, tuple[_At, _At]] = {}
        for d, dom in self.domains.items():
            edges = dom.iv.edges_ns
            key = edges.tobytes() if edges.size < 4096 else str(id(edges)).encode()
            if key not in lookups:  # domains read at the same instants share the lookups
                lookups[key] = (_At(edges, v.t0[new]), _At(edges, v.t1[new]))
            self._domain(v, d, *lookups[key])

    def _domain(self, v: _View, d: str, start: _At, end: _At) -> None:
        """A call's inclusive energy: ∫ its group's rate over its span, less the same over its
        children's spans, plus their inclusive energy once they close."""
        r, b, new = self.rates[d], v.b, v.new
        acc, accq = np.zeros(b.size), np.zeros(b.size)
        if b.carried:
            acc[:b.carried], accq[:b.carried] = self.carried[d]
        own = v.child - b.carried
        x = end.integral(r.rates, r.cum, v.grp[new]) - start.integral(r.rates, r.cum, v.grp[new])
        xq = end.integral(r.q[:, None], r.cum_q[:, None], 0) - start.integral(
            r.q[:, None], r.cum_q[:, None], 0)
        term = (end.integral(r.rates, r.cum, v.grp[v.par], own)
                - start.integral(r.rates, r.cum, v.grp[v.par], own))
        acc[new] += x
        accq[new] += xq
        np.subtract.at(acc, v.par, term)
        np.subtract.at(accq, v.par, xq[own])
        e = self.sums.energy[d]
        e["self"] += (np.bincount(v.site[new], x, self.n_sites)
                      - np.bincount(v.site[v.par], term, self.n_sites))
        _push_up(acc, accq, b.parent, v.depth, v.closed)
        self._closed(v, d, acc[v.closed], accq[v.closed])
        sharing, meas = _uncertainty(self.domains[d], r, v.grp[new], v.t0[new], v.t1[new])
        e["sharing_abs"] += np.bincount(v.site[new], np.abs(sharing), self.n_sites)
        e["meas_sq"] += np.bincount(v.site[new], meas ** 2, self.n_sites)
        e["below"] += np.bincount(v.site[new], (v.t1[new] - v.t0[new]) / at.NS
                                  < self.domains[d].iv.period_s, self.n_sites)
        open_ = ~b.closed
        self.carried[d] = (acc[open_], accq[open_])

    def _closed(self, v: _View, d: str, inc: np.ndarray, incq: np.ndarray) -> None:
        """The final figures of the calls that closed: per site, per repetition and, for the
        top-level ones, the domain's energy in calls."""
        top = v.b.parent[v.closed] < 0
        totals = self.totals[d]
        totals["in_calls_J"] += float(inc[top].sum())
        totals["in_calls_total_J"] += float(inc[top].sum() + incq[top].sum())
        top_rep = v.rep_of[v.closed][top]
        self.rep_in_calls[d] += np.bincount(top_rep[top_rep >= 0], inc[top][top_rep >= 0],
                                            self.n_reps)
        e, s = self.sums.energy[d], v.site[v.closed]
        e["inclusive"] += np.bincount(s, inc, self.n_sites)
        e["total"] += np.bincount(s, inc + incq, self.n_sites)
        _per_rep(e["per_rep"], s, v.rep_of[v.closed], inc)
        _merge_moments(e, s, inc, self.n_sites)


class _At:
    """Where instants fall among a sensor's intervals, found once for every integral over them
    (`attribution.cumulative`: clipped to the intervals, the last one closed)."""

    def __init__(self, edges: np.ndarray, t: np.ndarray) -> None:
        k = edges.size - 1
        self.tc = np.clip(t, edges[0], edges[-1])
        self.i = np.minimum(np.searchsorted(edges, self.tc, "right") - 1, k - 1)
        self.dt = (self.tc - edges[self.i]) / at.NS

    def integral(self, rates: np.ndarray, cum: np.ndarray, g: np.ndarray | int,
                 which: np.ndarray | None = None) -> np.ndarray:
        """∫ rates[:, g] from the first edge to each instant (`which` of them)."""
        i, dt = (self.i, self.dt) if which is None else (self.i[which], self.dt[which])
        return cum[i, g] + rates[i, g] * dt


def _push_up(acc: np.ndarray, accq: np.ndarray, parent: np.ndarray, depth: np.ndarray,
             closed: np.ndarray) -> None:
    """Each closed call's inclusive sums into its parent, deepest first (its children, closed
    before it, have already added theirs)."""
    if not closed.size:
        return
    d_closed = depth[closed]
    for d in range(int(d_closed.max()), 0, -1):
        idx = closed[d_closed == d]
        np.add.at(acc, parent[idx], acc[idx])
        np.add.at(accq, parent[idx], accq[idx])


def _per_rep(table: np.ndarray, site: np.ndarray, rep: np.ndarray, values: np.ndarray) -> None:
    ok = rep >= 0
    np.add.at(table, (site[ok], rep[ok]), values[ok])


def _count_calls(sums: SiteSums, site: np.ndarray, status: np.ndarray, dur_ns: np.ndarray,
                 rep: np.ndarray, n_sites: int) -> None:
    heads = (status & CONTINUES) == 0
    sums.calls += np.bincount(site, heads, n_sites)
    sums.pieces += np.bincount(site, minlength=n_sites)
    sums.raised += np.bincount(site, (status & RAISED) != 0, n_sites)
    sums.time_s += np.bincount(site, dur_ns / at.NS, n_sites)
    ok = rep >= 0
    np.add.at(sums.rep_calls, (site[ok & heads], rep[ok & heads]), 1)


def _uncertainty(dom: Domain, r: Rates, grp: np.ndarray, t0: np.ndarray,
                 t1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`attribution._uncertainty` of the new calls (it needs only the call and the domain)."""
    return at._uncertainty(dom.iv, r.above, r.h, r.weights[grp], t0, t1)


def moments(e: dict[str, Any], i: int | np.ndarray) -> Moments:
    """A site's (or several sites', merged) per-call energy moments."""
    idx = np.atleast_1d(i)
    out = Moments()
    for j in idx:
        n = int(e["n"][j])
        out = out.merge(Moments(n, n, 0, float(e["mean"][j]), float(e["m2"][j])))
    return out


def pieces_note(pieces: bool) -> str | None:
    """What the report says where a run was recorded in layer pieces."""
    if not pieces:
        return None
    return ("this run's layers were recorded in pieces: the streamed per-call energy figures "
            "(mean, spread) and the raised counts are per piece; calls, sums and times are per "
            "call")


def rates_of(domains: dict[str, Domain], method: str) -> dict[str, Rates]:
    """Each domain's fit and rates after sweep 1 (`_rates`)."""
    return {d: _rates(dom, method) for d, dom in domains.items()}


def run_totals(dom: Domain, r: Rates, in_calls: dict[str, float]) -> dict[str, float]:
    """The domain's run-level figures (`attribution.Attribution`'s floats; in calls as
    `program_figures.calls_only` counts them: the top-level calls)."""
    iv = dom.iv
    lengths = iv.lengths_s
    leaf = dom.leaf if dom.gaps else dom.leaf[:, :-1]
    d = leaf @ r.weights
    after_last = iv.edges_ns[:-1] >= dom.t_max
    above = float(r.above.sum())
    idle = float(dom.idle_W)
    inside = in_calls["in_calls_J"]
    if not dom.gaps:  # `attribution.attribute` as it is: every interval with a call in it
        inside = in_calls["self_J"] if dom.capped else float(r.above[d > 0].sum())
    outside_total = (iv.total_J - in_calls["in_calls_total_J"] if dom.gaps
                     else above - inside + idle * (lengths.sum() - dom.union.sum()))
    return {
        "total_J": iv.total_J, "idle_W": idle, "idle_J": idle * float(lengths.sum()),
        "above_idle_J": above, "in_calls_J": inside,
        "in_calls_total_J": in_calls["in_calls_total_J"],
        "outside_calls_J": above - inside, "outside_calls_total_J": outside_total,
        "tail_J": float(r.above[after_last & (d <= 0)].sum()),
    }
