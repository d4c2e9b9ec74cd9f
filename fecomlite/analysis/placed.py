"""Where calls fall among one sensor's intervals, found once for every sensor read at the same
instants (a CPU and a DRAM model, RAPL's domains).

The attribution's leaf time, its self-energy integrals, its busy time and its uncertainty all
start from the interval each call starts and ends in; a host's two domains would otherwise
search a million calls among the same edges once per domain and part (`attribution`).
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
        return acc[i] + rate[i] * self.offset_ns / NS


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
