"""Where calls fall among one sensor's intervals, found once for every sensor read at the same
instants (a CPU and a DRAM model, RAPL's domains).

The attribution's leaf time, its self-energy integrals, its busy time and its uncertainty all
start from the interval each call starts and ends in; a host's two domains would otherwise
search a million calls among the same edges once per domain and part (`attribution`). The sums
of spans over intervals (`overlap_matrix`, `union_matrix`) are here too.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

NS = 1e9


@dataclass(frozen=True)
class Instants:
    """Where instants fall among a sensor's edges (clipped to them, the last interval closed):
    found once, for every integral over those intervals (`cumulative`)."""

    interval: np.ndarray
    offset_ns: np.ndarray  # from the interval's first edge

    @classmethod
    def of(cls, edges: np.ndarray, t: np.ndarray) -> Instants:
        k = edges.size - 1
        if k <= 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        tc = np.clip(t, edges[0], edges[-1])
        i = np.minimum(np.searchsorted(edges, tc, "right") - 1, k - 1)
        return cls(i, tc - edges[i])

    def clipped(self, edges: np.ndarray) -> np.ndarray:
        """The instants clipped to the edges."""
        return edges[self.interval] + self.offset_ns

    def integral(self, edges: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """∫ rate dt from the first edge to each instant (`cumulative`)."""
        if rate.size == 0:
            return np.zeros(self.interval.size)
        acc = np.concatenate(([0.0], np.cumsum(rate * np.diff(edges) / NS)))
        i = self.interval
        out = rate[i]  # acc[i] + rate[i] * offset / NS, in one array (a million calls: 8 MB)
        out *= self.offset_ns
        out /= NS
        out += acc[i]
        return out


@dataclass(frozen=True)
class EdgeParts:
    """The geometry of `attribution._uncertainty`, which only the energies change between
    domains: per call, the interval its span starts in (`first`), the seconds of the span in it
    and 1 − the fraction of that interval they fill; for the calls that cross an edge
    (`cross`, a few: a call inside one interval has no last part), the same of the interval
    they end in (`last`)."""

    first: np.ndarray
    first_s: np.ndarray
    first_unfilled: np.ndarray
    cross: np.ndarray
    last: np.ndarray
    last_s: np.ndarray
    last_unfilled: np.ndarray


@dataclass(frozen=True)
class Placed:
    """Spans [t0, t1) among `edges`: the `Instants` of their starts and ends, and the interval
    their last part lies in (`last`: an end on an edge closes the interval before it; −1 for an
    end on the first edge). t1 is never before t0."""

    edges: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    start: Instants
    end: Instants
    last: np.ndarray

    @classmethod
    def of(cls, edges: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> Placed:
        start, end = Instants.of(edges, t0), Instants.of(edges, t1)
        last = end.interval
        on_edge = np.flatnonzero(end.offset_ns == 0)  # rare: searched again, left of the edge
        if on_edge.size:
            last = last.copy()
            left = np.searchsorted(edges, edges[end.interval[on_edge]], "left") - 1
            last[on_edge] = np.minimum(left, edges.size - 2)
        return cls(edges, t0, t1, start, end, last)

    @functools.cached_property
    def busy_s(self) -> np.ndarray:
        """Seconds of each interval during which at least one span is open (`union_matrix`,
        computed once, on first use)."""
        return union_matrix(self.edges, self.t0, self.t1)

    @functools.cached_property
    def edge_parts(self) -> EdgeParts:
        """`EdgeParts` of the spans (computed once, on first use)."""
        edges = self.edges
        lengths = np.diff(edges) / NS
        i = self.start.interval
        tc0, tc1 = self.start.clipped(edges), self.end.clipped(edges)
        first_s, first_unfilled = _part(np.minimum(tc1, edges[i + 1]) - tc0, lengths[i])
        cross = np.flatnonzero(self.last > i)
        j = self.last[cross]
        last_s, last_unfilled = _part(tc1[cross] - np.maximum(tc0[cross], edges[j]), lengths[j])
        return EdgeParts(i, first_s, first_unfilled, cross, j, last_s, last_unfilled)


def _part(ns: np.ndarray, length_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, 1 − the fraction of its interval they fill) of spans' parts `ns` long (none
    below zero) in intervals `length_s` long (an interval of no length: filled)."""
    part = np.clip(ns, 0, None) / NS
    filled = np.divide(part, length_s, out=np.ones_like(part), where=length_s > 0)
    return part, 1 - filled


def overlap_matrix(
    edges: np.ndarray, s0: np.ndarray, s1: np.ndarray, col: np.ndarray, weight: np.ndarray,
    ncols: int,
) -> np.ndarray:
    """(K, ncols) matrix: Σ weight × seconds of each segment [s0, s1) inside each interval."""
    k = edges.size - 1
    if k <= 0 or s0.size == 0:
        return np.zeros((max(k, 0), ncols))
    a = np.clip(np.asarray(s0, np.int64), edges[0], edges[-1])
    b = np.clip(np.asarray(s1, np.int64), edges[0], edges[-1])
    keep = b > a
    a, b, col, weight = a[keep], b[keep], np.asarray(col)[keep], np.asarray(weight)[keep]
    i = np.minimum(np.searchsorted(edges, a, "right") - 1, k - 1)
    j = np.minimum(np.searchsorted(edges, b, "left") - 1, k - 1)
    same = i == j
    flat = np.zeros(k * ncols)
    flat += np.bincount(i[same] * ncols + col[same], weight[same] * (b - a)[same] / NS, flat.size)
    cross = ~same
    return with_crossing(flat, edges, (a[cross], b[cross]), (i[cross], j[cross]), col[cross],
                          weight[cross], ncols)


def with_crossing(
    flat: np.ndarray, edges: np.ndarray, span: tuple[np.ndarray, np.ndarray],
    interval: tuple[np.ndarray, np.ndarray], col: np.ndarray, weight: np.ndarray, ncols: int,
) -> np.ndarray:
    """`flat` (the segments inside one interval, summed) with the segments that cross an edge:
    [a, b) from interval i to interval j > i, their first and last parts and the intervals
    they fill in between."""
    (a, b), (di, dj) = span, interval
    k = edges.size - 1
    size = k * ncols
    flat += np.bincount(di * ncols + col, weight * (edges[di + 1] - a) / NS, size)
    flat += np.bincount(dj * ncols + col, weight * (b - edges[dj]) / NS, size)
    mid = dj > di + 1
    marks = np.zeros(size)
    marks += np.bincount((di[mid] + 1) * ncols + col[mid], weight[mid], size)
    marks -= np.bincount(dj[mid] * ncols + col[mid], weight[mid], size)
    full = np.cumsum(marks.reshape(k, ncols), axis=0) * (np.diff(edges) / NS)[:, None]
    return flat.reshape(k, ncols) + full


def union_matrix(edges: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """Seconds of each interval during which at least one of the spans [t0, t1) is open."""
    if t0.size == 0:
        return np.zeros(max(edges.size - 1, 0))
    order = np.argsort(t0, kind="stable")
    a = np.asarray(t0, np.int64)[order]
    b = np.maximum.accumulate(np.maximum(np.asarray(t1, np.int64)[order], a))
    new = np.concatenate(([True], a[1:] > b[:-1]))
    seg = np.flatnonzero(new)
    starts = a[seg]
    ends = np.concatenate((b[seg[1:] - 1], b[-1:]))
    n = starts.size
    return overlap_matrix(edges, starts, ends, np.zeros(n, np.int64), np.ones(n), 1)[:, 0]
