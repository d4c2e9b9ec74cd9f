"""The streamed analysis' two sweeps through the C sweep (`_sweep.Sweep`): the same sums as
`streamed.sweep_one` / `streamed.sweep_two`, a call a few table lookups instead of ~150 numpy
operations over batches.

Why: at ~2 µs a call the numpy sweeps report a day of training (~90 M calls) in minutes. The C
pass keeps each thread's open calls on a stack (nesting as `attribution.nesting` gives it for
calls that nest), so the calls need only be released in start order (`sweep.released`); what is
not per call (the unions, the program's gaps, memory per call) stays in numpy, per batch.
`FECOMLITE_SWEEP=numpy` (or a build without a C compiler) takes the numpy sweeps; a test holds
the two to the same figures.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis import sweep
from fecomlite.runtime.batch_codec import CONTINUES

try:
    from fecomlite.analysis._sweep import Sweep
except ImportError:  # built without a C compiler: the numpy sweeps
    Sweep = None

ENV = "FECOMLITE_SWEEP"


def available() -> bool:
    """Whether the C sweep is built and not turned off (`FECOMLITE_SWEEP=numpy`)."""
    return Sweep is not None and os.environ.get(ENV, "c") != "numpy"


def start_order(t0: np.ndarray, t1: np.ndarray, thread: np.ndarray) -> np.ndarray | None:
    """The order that puts calls of one thread that start at one instant outer first (the later
    end), as `attribution.nesting` orders them, in a released batch (by start, ties as read);
    None when no thread has two calls at one instant (the usual case). Only the C pass is given
    this order: memory per call finds a site's first call among ties as read, as the whole-run
    analysis does."""
    tie = np.flatnonzero(t0[1:] == t0[:-1])
    if not tie.size:
        return None
    tied = np.union1d(tie, tie + 1)  # the calls that share their start with another
    by = np.lexsort((thread[tied], t0[tied]))
    a, th = t0[tied][by], thread[tied][by]
    if not ((a[1:] == a[:-1]) & (th[1:] == th[:-1])).any():  # none on one thread
        return None
    return np.lexsort((-t1, t0))


def _pass(sweep_c: Any, order: np.ndarray | None, site: np.ndarray, thread: np.ndarray,
          rep: np.ndarray, t0: np.ndarray, t1: np.ndarray, status: np.ndarray) -> None:
    """The C pass over one released batch, in `start_order`."""
    arrays = (site, thread, rep, t0, t1, status)
    sweep_c.add(*(arrays if order is None else (np.ascontiguousarray(a[order]) for a in arrays)))


def _edges(domains: dict[str, Any]) -> tuple[list[np.ndarray], dict[str, int]]:
    """The distinct sensors' edges, and each domain's index into them."""
    found: list[np.ndarray] = []
    index: dict[str, int] = {}
    for d, dom in domains.items():
        edges = np.ascontiguousarray(dom.iv.edges_ns, np.int64)
        index[d] = next((i for i, e in enumerate(found) if e.size == edges.size
                         and np.array_equal(e, edges)), len(found))
        if index[d] == len(found):
            found.append(edges)
    return found, index


def _calls(chunks: Callable[[], Any], threads: sweep.Threads,
           site_index: Callable[[np.ndarray], np.ndarray], batch_events: int) -> Any:
    """(columns, site, thread, t1: the end, never before the start; `start_order`, whether the
    repetition ends) of each released batch."""
    for events, watermark in sweep.released(chunks(), batch_events):
        thread = threads(events)
        t0 = events["t_start_ns"]
        t1 = np.maximum(events["t_end_ns"], t0)
        yield (events, np.ascontiguousarray(site_index(events["site_id"]), np.int64), thread,
               t1, start_order(t0, t1, thread), watermark == np.inf)


def leaf_sums(chunks: Callable[[], Any], threads: sweep.Threads, site_fit: np.ndarray,
              site_index: Callable[[np.ndarray], np.ndarray], leads: list[Any],
              batch_events: int, each_batch: Callable[[np.ndarray, np.ndarray, int], None]
              ) -> None:
    """Sweep 1's leaf time into each lead domain's `leaf` (`attribution.leaf_time` over the run);
    `each_batch(t0, t1, rep)` of the new calls, in start order, for what stays in numpy."""
    edges, index = _edges({dom.name: dom for dom in leads})
    parts, sums = [], []
    for dom in leads:
        flat, marks = np.zeros(dom.leaf.shape), np.zeros(dom.leaf.shape)
        sums.append((flat, marks))
        parts.append((index[dom.name], flat, marks, dom.leaf.shape[1]))
    c = Sweep(np.ascontiguousarray(site_fit, np.int64), 0, edges, parts, [], None)
    for cols, site, thread, t1, order, ends in _calls(chunks, threads, site_index, batch_events):
        t0 = cols["t_start_ns"]
        _pass(c, order, site, thread, np.full(t0.size, -1, np.int64), t0, t1, cols["status"])
        each_batch(t0, t1, int(cols["rep"][0]))
        if ends:
            c.flush()
    c.flush()
    for dom, (flat, marks) in zip(leads, sums, strict=True):
        lengths = np.diff(dom.iv.edges_ns) / at.NS
        dom.leaf += flat + np.cumsum(marks, axis=0) * lengths[:, None]


def _energy_part(dom: Any, r: Any, e: dict[str, Any], totals: np.ndarray,
                 rep_in: np.ndarray, edges: int) -> tuple[Any, ...]:
    iv = dom.iv
    lengths = np.diff(iv.edges_ns) / at.NS
    power_above = np.divide(r.above, lengths, out=np.zeros_like(r.above), where=lengths > 0)
    sig = iv.edge_sigma_ns / at.NS
    meas = np.sqrt((power_above * sig[:-1]) ** 2 + (power_above * sig[1:]) ** 2
                   + iv.quantum_J ** 2 / 6)

    def f(a: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(a, np.float64)

    outs = tuple(e[k] for k in ("inclusive", "total", "self", "sharing_abs", "meas_sq", "below",
                                "n", "mean", "m2", "per_rep")) + (totals, rep_in)
    return (edges, r.rates.shape[1], f(r.rates), f(r.cum), f(r.q), f(r.cum_q), f(r.h),
            f(r.weights), f(r.above), f(lengths), f(meas), float(iv.period_s), outs)


def energy_sums(chunks: Callable[[], Any], threads: sweep.Threads, site_fit: np.ndarray,
                site_index: Callable[[np.ndarray], np.ndarray], domains: dict[str, Any],
                rates: dict[str, Any], sums: Any, rep_col: dict[int, int], memory: Any,
                batch_events: int) -> dict[str, Any]:
    """Sweep 2 into `sums` (`streamed.SiteSums`, from zeros) and `memory`; returns what
    `streamed.sweep_two` returns beside the sums."""
    n_reps = sums.rep_calls.shape[1]
    edges, index = _edges(domains)
    totals = {d: np.zeros(2) for d in domains}
    rep_in = {d: np.zeros(n_reps) for d in domains}
    parts = [_energy_part(dom, rates[d], sums.energy[d], totals[d], rep_in[d], index[d])
             for d, dom in domains.items()]
    rep_events = np.zeros(n_reps)
    c = Sweep(np.ascontiguousarray(site_fit, np.int64), n_reps, edges, [], parts,
              (sums.calls, sums.pieces, sums.raised, sums.time_s, sums.rep_calls, rep_events))
    pieces = False
    for cols, site, thread, t1, order, ends in _calls(chunks, threads, site_index, batch_events):
        t0, status = cols["t_start_ns"], cols["status"]
        seen = np.unique(cols["rep"])
        rep_of = np.array([rep_col.get(int(r), -1) for r in seen], np.int64)[
            np.searchsorted(seen, cols["rep"])]
        _pass(c, order, site, thread, rep_of, t0, t1, status)
        pieces = pieces or bool((status & CONTINUES).any())
        memory.add(site, cols["rep"], cols["pid"], status, t0, cols["t_end_ns"])
        if ends:
            c.flush()
    c.flush()
    return {"totals": {d: {"in_calls_J": float(t[0]), "in_calls_total_J": float(t[1])}
                       for d, t in totals.items()},
            "pieces": pieces, "rep_events": [int(v) for v in rep_events],
            "rep_in_calls": {d: v.tolist() for d, v in rep_in.items()}}
