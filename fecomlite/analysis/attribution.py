"""Energy attribution: call intervals × one sensor's sample series → energy per call.

Pure numpy over arrays; no store access (`run_analysis` loads runs). DESIGN.md rule 2: a
sensor resolves energy only per update interval (NVML: ~100 ms), so each interval's energy above
idle is shared among the calls active in it.

How it works:
1. The series becomes contiguous *sensor intervals* (`SensorIntervals`), each with the energy
   the sensor saw in it, between the sensor's real update instants (an NVML counter is read
   every few ms but changes every ~100 ms: it updated in the read gap before a new value shows);
   a power series is integrated the same way.
2. Calls on one thread nest (a wrapped call inside another); only the innermost open call (the
   leaf) is "active" at any instant, so nesting never counts time twice. Concurrent threads are
   active side by side.
3. Inside interval k the above-idle energy A_k goes to the leaf time in it, weighted by the
   API's power intensity I (1 for every API with `method="overlap"`): a call's rate is
   A_k · I / D_k with D_k = Σ leaf-time × I. Each interval's energy is conserved exactly;
   intervals with no call put theirs *outside calls*.
4. `self` energy is the leaf part; `inclusive` = self + all descendants, as profilers report.

All of it runs on sorted arrays (searchsorted, cumsum, bincount): one Python loop per nesting
depth, none per call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from fecomlite.analysis.distributions import chi2_sf
from fecomlite.analysis.placed import (
    NS,
    Instants,
    Placed,
    overlap_matrix,
    union_matrix,
    with_crossing,
)

METHODS = ("overlap", "intensity", "auto")
SEMANTICS = ("window", "linear")
# 1σ relative error of a share of an interval (DESIGN.md rule 2: "mostly within ±30 %"); on the
# h200-nvml fixture it puts 60 % of short calls within 1σ of the truth and 94 % within 2σ
DEFAULT_REL_SPREAD = 0.3
INTENSITY_FLOOR = 1e-3  # of the pooled mean: every busy interval's energy reaches its calls
RIDGE = 1e-3  # pull toward the pooled mean, relative to each API's own data (1e-2 biased a
# synthetic two-API fit by 0.7 %, 3× its σ; 1e-3 by 0.07 %)
CV_FOLDS = 5
CV_MIN_GAIN = 0.02  # auto: intensities must predict held-out intervals ≥ 2 % better
WALD_P = 0.01  # auto: intensities must differ from the pooled mean at this level
# an API's own intensity is fitted only where the data identify it: busy in at least this many
# sensor intervals (≥ 5 % of each one's busy time), for at least this many median intervals in
# all, with its share of the busy time varying this much (1σ) across the busy intervals
MIN_INTERVALS = 5
MIN_BUSY_PERIODS = 2.0
MIN_MIX_SPREAD = 0.05


# -- sensor intervals ------------------------------------------------------------------------


@dataclass(frozen=True)
class SensorIntervals:
    """A sensor's series as contiguous intervals [edges_ns[k], edges_ns[k+1]) with energy_J[k].

    edge_sigma_ns: 1σ uncertainty of each edge's time (where inside a read gap the update was).
    quantum_J: the smallest step the sensor reports (a counter's resolution), 0 when unknown.
    period_s: the sensor's update period (median interval), for the below-resolution flag.
    """

    edges_ns: np.ndarray
    energy_J: np.ndarray
    edge_sigma_ns: np.ndarray
    quantum_J: float
    period_s: float

    @property
    def count(self) -> int:
        return int(self.energy_J.size)

    @property
    def lengths_s(self) -> np.ndarray:
        return np.diff(self.edges_ns) / NS

    @property
    def power_W(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.lengths_s > 0, self.energy_J / self.lengths_s, 0.0)

    @property
    def total_J(self) -> float:
        return float(self.energy_J.sum())


def _empty_intervals() -> SensorIntervals:
    return SensorIntervals(np.zeros(1, np.int64), np.zeros(0), np.zeros(1), 0.0, float("nan"))


def _sorted_series(t_ns: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    t = np.asarray(t_ns, dtype=np.int64)
    v = np.asarray(values, dtype=float)
    if t.shape != v.shape:
        raise ValueError(f"{t.size} sample times but {v.size} values")
    ok = np.isfinite(v)
    t, v = t[ok], v[ok]
    order = np.argsort(t, kind="stable")
    return t[order], v[order]


def _first_reads(v: np.ndarray) -> np.ndarray:
    """Indices of the first reads that show a new value: the sensor updated just before them."""
    return np.flatnonzero(np.diff(v) != 0) + 1


def _update_times(t: np.ndarray, ch: np.ndarray, period_s: float) -> tuple[np.ndarray, np.ndarray]:
    """When each update happened, and its 1σ, for a change first seen by read t[ch].

    Read much faster than it updates (NVML: every 4 ms, updated every 100 ms), the sensor
    updated somewhere in the gap since the previous read: its middle. Read no faster than it
    updates (a meter or an estimate computed at each read, RAPL read every 10 ms), the value is
    fresh at the read, lagging it by half the sensor's own update period where that is known
    and clearly shorter than the gap (RAPL: 1 ms).
    """
    period = period_s * NS
    gap = (t[ch] - t[ch - 1]).astype(float)
    oversampled = gap < period / 2
    lag = np.where(period < gap / 2, period, 0.0)
    width = np.where(oversampled, gap, lag)
    return t[ch] - (width // 2).astype(np.int64), width / np.sqrt(12)


def _period(gaps_ns: np.ndarray) -> float:
    """The update period from gaps between updates: repeated values make some gaps multiples of
    it, so take the median of the gaps near the shortest common ones."""
    if gaps_ns.size == 0:
        return float("nan")
    short = np.percentile(gaps_ns, 10)
    return float(np.median(gaps_ns[gaps_ns <= 1.5 * short]) / NS)


def counter_intervals(
    t_ns: np.ndarray, value_J: np.ndarray, *, wrap_J: float | None = None,
    quantum_J: float = 0.0, period_s: float | None = None,
) -> SensorIntervals:
    """Intervals between a cumulative energy counter's update instants.

    Each update is placed by `_update_times` (in the read gap before the first read that shows
    it, or at that read). The energy before the first update seen is kept as a leading interval of
    one period, so the intervals hold the counter's whole difference, last − first. A decreasing
    step is a wrap when `wrap_J` is given, else an error (`fecomlite.sensors` unwraps RAPL).
    quantum_J: the counter's resolution (NVML: 1 mJ, RAPL: 1 µJ), for the uncertainty.
    period_s: the sensor's update period when known (RAPL: 1 ms, shorter than the read gap);
    default: the median gap between observed changes.
    """
    t, v = _sorted_series(t_ns, value_J)
    steps = np.diff(v)
    if np.any(steps < 0):
        if wrap_J is None:
            raise ValueError("energy counter decreased and no wrap range was given")
        steps = np.where(steps < 0, steps + wrap_J, steps)
        v = np.concatenate(([v[0]], v[0] + np.cumsum(steps))) if v.size else v
    ch = _first_reads(v)
    if ch.size < 2:
        return _empty_intervals()
    period = period_s or _period(np.diff(t[ch]))
    edges, sigma = _update_times(t, ch, period)
    lead = edges[0] - int(round(period * NS))
    edges = np.concatenate(([lead], edges))
    energy = np.diff(np.concatenate(([v[0]], v[ch])))
    sigma = np.concatenate(([period * NS / np.sqrt(12)], sigma))
    return SensorIntervals(edges, energy, sigma, quantum_J, period)


def power_intervals(
    t_ns: np.ndarray,
    power_W: np.ndarray,
    *,
    semantics: str = "window",
    period_s: float | None = None,
) -> SensorIntervals:
    """Intervals of a power series (W), integrated to energy.

    semantics="window": each new value is the mean power since the previous update (NVML's
    instant-power field, utilisation-based CPU estimates): piecewise constant backwards from the
    read that shows it. A value held over several update periods is split into period-long
    pieces so the apportioning keeps the sensor's resolution.
    semantics="linear": instantaneous readings (a watt-meter log): trapezoids between reads.
    NVML's instant-power field is a short sample rather than the mean of its whole window: per
    interval it agrees with the energy counter within ~3 % (h200-nvml), but a burst much shorter
    than the period can be missed or overcounted. Prefer a counter where there is one.
    """
    if semantics not in SEMANTICS:
        raise ValueError(f"semantics must be one of {SEMANTICS}, not {semantics!r}")
    t, p = _sorted_series(t_ns, power_W)
    if t.size < 2:
        return _empty_intervals()
    if semantics == "linear":
        gaps = np.diff(t)
        energy = gaps / NS * (p[1:] + p[:-1]) / 2
        period = period_s or float(np.median(gaps) / NS)
        return SensorIntervals(t, energy, np.zeros(t.size), 0.0, period)
    ch = _first_reads(p)
    period = period_s or _period(np.diff(t[ch]))
    if not np.isfinite(period):
        period = float(np.median(np.diff(t)) / NS)
    period_ns = max(int(round(period * NS)), 1)
    updates, sigma = _update_times(t, ch, period)
    # the value read first held from the first read (or one period before the first change),
    # the value read last holds to the last read: a series that stays at one value (an estimate
    # at its ceiling) keeps its energy to the end
    lead = min(int(t[0]), int(updates[0]) - period_ns) if ch.size else int(t[0])
    edges = np.concatenate(([lead], updates, [t[-1]]))
    sigma = np.concatenate(([period_ns / np.sqrt(12)], sigma, [period_ns / np.sqrt(12)]))
    old = np.concatenate((p[ch - 1], p[-1:]))
    new = np.concatenate((p[ch], p[-1:]))
    if edges[-1] <= edges[-2]:  # the last read showed the last change: no held stretch
        edges, sigma, old, new = edges[:-1], sigma[:-1], old[:-1], new[:-1]
    if edges.size < 2:
        return _empty_intervals()
    edges, power, sigma = _split_windows(edges, old, new, sigma, period_ns)
    return SensorIntervals(edges, np.diff(edges) / NS * power, sigma, 0.0, period)


def _split_windows(
    edges: np.ndarray, old: np.ndarray, new: np.ndarray, sigma: np.ndarray, period_ns: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Power per period-long piece of each window between two changes of a windowed series.

    Between changes the sensor updated about every period without changing its value, so each
    window is cut into round(length / period) pieces: the last piece (ending at the change) holds
    the new value, the earlier ones the old value that was being repeated.
    """
    widths = np.diff(edges)
    pieces = np.maximum(np.rint(widths / period_ns), 1).astype(np.int64)
    ends = np.cumsum(pieces)
    within = np.arange(ends[-1]) - np.repeat(ends - pieces, pieces)
    count = np.repeat(pieces, pieces)
    starts = np.repeat(edges[:-1], pieces) + within * np.repeat(widths, pieces) // count
    is_last = within == count - 1
    power = np.where(is_last, np.repeat(new, pieces), np.repeat(old, pieces))
    piece_sigma = np.where(within == 0, np.repeat(sigma[:-1], pieces), period_ns / np.sqrt(12))
    return (
        np.concatenate((starts, edges[-1:])),
        power,
        np.concatenate((piece_sigma, sigma[-1:])),
    )


def sensor_intervals(
    kind: str, t_ns: np.ndarray, values: np.ndarray, *, semantics: str = "window",
    period_s: float | None = None,
) -> SensorIntervals:
    """`counter_intervals` for kind "counter" (J), `power_intervals` for kind "power" (W)."""
    if kind == "counter":
        return counter_intervals(t_ns, values, period_s=period_s)
    if kind == "power":
        return power_intervals(t_ns, values, semantics=semantics, period_s=period_s)
    raise ValueError(f"kind must be 'counter' or 'power', not {kind!r}")


def estimate_idle_W(
    intervals: SensorIntervals, t_start_ns: np.ndarray, t_end_ns: np.ndarray,
    settle_s: float = 1.0,
) -> float:
    """Idle power when none was measured: the median power of intervals with no call in them and
    none in the `settle_s` before (so tails are excluded); the 5th percentile of all if none."""
    if intervals.count == 0:
        return float("nan")
    power = intervals.power_W
    a, b = intervals.edges_ns[:-1], intervals.edges_ns[1:]
    busy = union_matrix(intervals.edges_ns, np.asarray(t_start_ns), np.asarray(t_end_ns))
    settle = np.asarray(t_end_ns, np.int64) + int(settle_s * NS)
    recent = union_matrix(intervals.edges_ns, np.asarray(t_start_ns), settle)
    quiet = (busy == 0) & (recent == 0) & (b > a)
    if quiet.sum() >= 3:
        return float(np.median(power[quiet]))
    return float(np.percentile(power, 5))


def window_energy(
    intervals: SensorIntervals, idle_W: float, start_ns: int, end_ns: int
) -> tuple[float, float]:
    """(total J, above-idle J) in [start_ns, end_ns], prorating the intervals cut by the window."""
    if intervals.count == 0 or end_ns <= start_ns:
        return 0.0, 0.0
    ov = overlap_matrix(
        intervals.edges_ns, np.array([start_ns]), np.array([end_ns]), np.zeros(1, np.int64),
        np.ones(1), 1,
    )[:, 0]
    frac = np.divide(ov, intervals.lengths_s, out=np.zeros_like(ov), where=intervals.lengths_s > 0)
    total = float((frac * intervals.energy_J).sum())
    return total, total - idle_W * float(ov.sum())


# -- calls: nesting and leaf time --------------------------------------------------------------


def nesting(
    t_start_ns: np.ndarray, t_end_ns: np.ndarray, thread: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(parent index or −1, depth) of every call; calls on one thread nest like a call stack.

    A call that overlaps an earlier one on its thread without lying inside it (not a stack: async
    code, generators) gets the nearest enclosing call as parent; energy stays conserved, that
    thread's time just counts twice where the two overlap.

    A call's depth is the calls of its thread open when it starts: those started before it
    (outer first at one instant: the later end) less those ended by then (an end before a start
    at one instant, a zero-length call's after); its parent the latest call one level up.
    """
    t0 = np.asarray(t_start_ns, np.int64)
    t1 = np.maximum(np.asarray(t_end_ns, np.int64), t0)
    n = t0.size
    th = np.zeros(n, np.int64) if thread is None else np.asarray(thread, np.int64)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = _start_order(t0, t1, th)
    th_o = th[order]
    bounds = np.flatnonzero(np.concatenate(([True], th_o[1:] != th_o[:-1], [True])))
    t0_o, t1_o = t0[order], t1[order]
    ends = 2 * t1_o + (t1_o == t0_o)  # a zero-length call ends after the starts
    depth_o = np.empty(n, np.int64)
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        # ends come nearly in order: a merge sort runs through them ~10x faster
        ended = np.searchsorted(np.sort(ends[a:b], kind="stable"), 2 * t0_o[a:b], "right")
        depth_o[a:b] = np.arange(b - a) - ended
    depth = np.empty(n, np.int64)
    depth[order] = depth_o
    parent = np.full(n, -1, np.int64)
    for d in range(1, int(depth_o.max()) + 1):
        outer = np.flatnonzero(depth_o == d - 1)
        inner = np.flatnonzero(depth_o == d)
        found = np.searchsorted(outer, inner) - 1
        parent[order[inner]] = np.where(found >= 0, order[outer[np.maximum(found, 0)]], -1)
    return _contained(parent, t0, t1, th, depth)


def small_int_order(values: np.ndarray) -> np.ndarray:
    """`np.argsort(values, kind="stable")`; for values that fit 16 bits (threads, sites) by
    numpy's radix sort, ~10x faster on a million calls than the merge sort of int64."""
    if values.size and int(values.min()) >= 0 and int(values.max()) < 1 << 15:
        return np.argsort(values.astype(np.int16), kind="stable")
    return np.argsort(values, kind="stable")


def _start_order(t0: np.ndarray, t1: np.ndarray, th: np.ndarray) -> np.ndarray:
    """Calls by thread, then start, outer first at one instant (later end), then as given;
    without a sort by time when the calls come in start order (they usually do)."""
    if t0.size > 1 and bool((t0[1:] >= t0[:-1]).all()):
        order = small_int_order(th)
        t0_o, th_o = t0[order], th[order]
        if not ((t0_o[1:] == t0_o[:-1]) & (th_o[1:] == th_o[:-1])).any():
            return order
    return np.lexsort((-t1, t0, th))


def _contained(
    parent: np.ndarray, t0: np.ndarray, t1: np.ndarray, th: np.ndarray,
    level: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Climb each parent link until the parent really contains the call (a stack's invariant);
    only calls that overlap without nesting need it, and only a link that moved is checked
    again. Returns (parent, depth): the depth is the level (open calls at the start) where no
    link moved and every call below the top has a parent, as in a call stack."""
    parent = parent.copy()
    moved = False
    idx = np.flatnonzero(parent >= 0)
    while idx.size:
        p = parent[idx]
        idx = idx[(th[p] != th[idx]) | (t0[p] > t0[idx]) | (t1[p] < t1[idx])]
        if not idx.size:
            break
        parent[idx] = parent[parent[idx]]
        moved = True
        idx = idx[parent[idx] >= 0]
    stack = level is not None and not moved and bool(((parent >= 0) == (level > 0)).all())
    return parent, level if stack and level is not None else _depths(parent)


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth from parent links (the links only ever point to calls that started earlier): each
    call climbs its links, those at the top let go."""
    depth = np.zeros(parent.size, np.int64)
    idx = np.flatnonzero(parent >= 0)
    up = parent[idx]
    while idx.size:
        depth[idx] += 1
        up = parent[up]
        more = up >= 0
        idx, up = idx[more], up[more]
    return depth


def leaf_time(
    edges: np.ndarray, t0: np.ndarray, t1: np.ndarray, group: np.ndarray, parent: np.ndarray,
    ngroups: int, placed: Placed | None = None,
) -> np.ndarray:
    """(K, ngroups): seconds of leaf (self) time of each group's calls inside each interval.

    A call's span counts for its group, each direct child's span is taken back from the parent's
    group: what remains is the time the call itself was innermost. A child's span is its own, so
    each span is placed among the edges once (`placed`, when already known), not twice.
    """
    k = edges.size - 1
    if k <= 0 or t0.size == 0:
        return np.zeros((max(k, 0), ngroups))
    p = placed or Placed.of(edges, np.asarray(t0, np.int64), np.asarray(t1, np.int64))
    a, b = p.start.clipped(edges), p.end.clipped(edges)
    i, j = p.start.interval, p.last
    child = np.flatnonzero(parent >= 0)
    keep = b > a
    inside = keep & (i == j)
    seconds = (b - a) / NS
    kid = child[inside[child]]  # children inside one interval: taken back from their parent's group
    flat = np.zeros(k * ngroups)
    flat += np.bincount(
        np.concatenate(((i * ngroups + group)[inside], i[kid] * ngroups + group[parent[kid]])),
        np.concatenate((seconds[inside], -seconds[kid])), flat.size)
    calls, kids = np.flatnonzero(keep & ~inside), child[(keep & ~inside)[child]]
    both = np.concatenate((calls, kids))
    return with_crossing(
        flat, edges, (a[both], b[both]), (i[both], j[both]),
        np.concatenate((group[calls], group[parent[kids]])),
        np.concatenate((np.ones(calls.size), -np.ones(kids.size))), ngroups)


# -- intensities (issue 8) ------------------------------------------------------------------


@dataclass(frozen=True)
class IntensityFit:
    """Each group's (API's) above-idle power while it is the active call, fitted over intervals.

    intensity_W: the fit, floored at INTENSITY_FLOOR × pooled; sigma_W: its 1σ (heteroscedastic
    sandwich covariance of the ridge fit); pooled_W: the common mean Σ energy / Σ busy time;
    busy_s: each group's leaf time; distinct: the group's intensity differs from the pooled one
    by > 2σ; identifiable: the data identify the group's own intensity (`identifiable`), else it
    gets the pooled intensity of the groups that are not (sigma_W inf); capped: the fit was
    above ceiling_W (the domain's highest power above idle) and was cut to it; supported: the
    data tell the groups apart (Wald test at WALD_P and held-out intervals predicted ≥
    CV_MIN_GAIN better than with the pooled intensity); reason: why or why not; rel_residual:
    the fit's typical relative error per interval; rows: intervals used.
    """

    intensity_W: np.ndarray
    sigma_W: np.ndarray
    pooled_W: float
    busy_s: np.ndarray
    distinct: np.ndarray
    supported: bool
    reason: str
    cv_gain: float
    wald_p: float
    rel_residual: float
    rows: int
    identifiable: np.ndarray
    capped: np.ndarray
    ceiling_W: float


def identifiable(
    leaf: np.ndarray, lengths_s: np.ndarray | None = None
) -> np.ndarray:
    """Which groups' own intensity the intervals can identify: busy in ≥ MIN_INTERVALS intervals,
    for ≥ MIN_BUSY_PERIODS median interval lengths, with a share of the busy time that varies
    (≥ MIN_MIX_SPREAD) from interval to interval. A call of 4 µs, or an API that always runs
    in the same proportion to another, cannot be told apart from the rest."""
    rows = leaf.sum(axis=1)
    busy_rows = rows > 0
    if not busy_rows.any():
        return np.zeros(leaf.shape[1], bool)
    share = leaf[busy_rows] / rows[busy_rows][:, None]
    period = float(np.median(lengths_s[busy_rows])) if lengths_s is not None else float(
        np.median(rows[busy_rows]))
    return (
        ((share >= 0.05).sum(axis=0) >= MIN_INTERVALS)
        & (leaf.sum(axis=0) >= MIN_BUSY_PERIODS * period)
        & (share.std(axis=0) >= MIN_MIX_SPREAD)
    )


def _ridge_nnls(
    m: np.ndarray, y: np.ndarray, prior: float, ridge: float
) -> tuple[np.ndarray, np.ndarray]:
    """argmin ||m x − y||² + ridge Σ_a d_a (x_a − prior)², x ≥ 0, with d_a = (mᵀm)_aa.

    Solved on the Cholesky factor of the normal matrix (G × G, whatever the number of rows).
    Returns x and the inverse normal matrix (for the covariance).
    """
    g = m.T @ m
    d = np.diag(g).copy()
    d[d <= 0] = 1.0
    c = g + ridge * np.diag(d)
    rhs = m.T @ y + ridge * d * prior
    r = np.linalg.cholesky(c).T
    z = np.linalg.solve(r.T, rhs)
    return nnls(r, z), np.linalg.inv(c)


def nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x − b||, x ≥ 0: Lawson and Hanson's active-set method, as scipy's `nnls`
    (which brings scipy.optimize, half a second of every `fecomlite run`'s summary, for a
    problem of a few columns)."""
    n = a.shape[1]
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(a.shape) * max(np.abs(a).sum(axis=0).max(), 1.0)
    for _ in range(3 * n):
        w = a.T @ (b - a @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            s = np.zeros(n)
            s[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if s[passive].min() > tol:
                break
            blocked = passive & (s <= tol)
            step = np.min(x[blocked] / (x[blocked] - s[blocked]))
            x += step * (s - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = s
    return x


def fit_intensities(
    leaf: np.ndarray, above_J: np.ndarray, *, ridge: float = RIDGE, folds: int = CV_FOLDS,
    lengths_s: np.ndarray | None = None, ceiling_W: float = np.inf,
) -> IntensityFit:
    """Fit per-group intensities from intervals whose mix of groups differs.

    above_J[k] ≈ Σ_a intensity_a × leaf[k, a]: non-negative least squares with a ridge pull
    toward the pooled mean, so groups the data cannot separate (always together in the same
    proportions) stay near the common value. Only `identifiable` groups get a column of their
    own; the others share one pooled column. No intensity exceeds ceiling_W (the domain's highest
    power above idle: a call cannot draw more than the whole domain). The uncertainty is the
    heteroscedasticity-robust (HC1 sandwich) covariance. Whether the fit is *supported* is
    decided by a Wald test of the intensities against the pooled mean and by interleaved k-fold
    cross-validation of per-interval predictions against the overlap model (one pooled intensity).
    """
    busy_rows = leaf.sum(axis=1) > 0
    m, y = leaf[busy_rows], above_J[busy_rows]
    ngroups = leaf.shape[1]
    busy = leaf.sum(axis=0)
    pooled = float(y.sum() / m.sum()) if m.sum() > 0 else 0.0
    pooled = min(pooled, ceiling_W)
    floor = max(pooled, 0.0) * INTENSITY_FLOOR
    seen = busy > 0
    own = identifiable(leaf, lengths_s) & seen
    none = IntensityFit(
        np.full(ngroups, max(pooled, floor)), np.full(ngroups, np.inf), pooled, busy,
        np.zeros(ngroups, bool), False, "", 0.0, 1.0, float("nan"), int(m.shape[0]),
        own, np.zeros(ngroups, bool), float(ceiling_W),
    )
    if seen.sum() < 2:
        return _with_reason(none, "only one API ran, so there is nothing to tell apart")
    if pooled <= 0:
        return _with_reason(none, "the calls drew no energy above idle")
    rest = seen & ~own
    cols = [m[:, g] for g in np.flatnonzero(own)] + ([m[:, rest].sum(axis=1)] if rest.any()
                                                     else [])
    if own.sum() == 0 or len(cols) < 2:
        return _with_reason(none, (
            "no API ran long enough, in enough sensor intervals and in a varying enough mix "
            "for its own power to be told apart: every call is charged alike"))
    ms = np.stack(cols, axis=1)
    if m.shape[0] <= ms.shape[1] + 2:
        return _with_reason(none, f"only {m.shape[0]} sensor intervals had calls: too few to "
                                  f"tell {ms.shape[1]} APIs apart")
    x, inv = _ridge_nnls(ms, y, pooled, ridge)
    resid = y - ms @ x
    n, p = ms.shape
    meat = (ms * (resid**2)[:, None]).T @ ms * (n / (n - p))
    cov = inv @ meat @ inv
    sigma = np.sqrt(np.clip(np.diag(cov), 0, None))
    dev = x - pooled
    wald = float(dev @ np.linalg.pinv(cov) @ dev)
    wald_p = chi2_sf(wald, p - 1)
    pred = ms @ x
    positive = pred > 0  # no interval predicted above idle: no relative residual to speak of
    rel = float(np.sqrt(np.median((resid[positive] / pred[positive]) ** 2))) if positive.any() \
        else float("nan")
    gain = _cv_gain(ms, y, pooled, ridge, folds)
    capped_cols = x > ceiling_W
    x = np.minimum(x, ceiling_W)
    intensity = np.full(ngroups, pooled)
    sig = np.full(ngroups, np.inf)
    capped = np.zeros(ngroups, bool)
    intensity[own] = np.maximum(x[: own.sum()], floor)
    sig[own] = sigma[: own.sum()]
    capped[own] = capped_cols[: own.sum()]
    if rest.any():
        intensity[rest] = max(x[-1], floor)
        capped[rest] = capped_cols[-1]
    distinct = np.zeros(ngroups, bool)
    distinct[own] = np.abs(dev[: own.sum()]) > 2 * sigma[: own.sum()]
    supported = wald_p < WALD_P and gain >= CV_MIN_GAIN
    if supported:
        reason = (f"the APIs' powers differ (p = {wald_p:.2g}) and per-API powers predict "
                  f"unseen sensor intervals {gain:.0%} better than one power for all calls")
    elif wald_p >= WALD_P:
        reason = (f"this run cannot tell the APIs' powers apart (p = {wald_p:.2g}), so every "
                  "call is charged alike")
    elif gain < 0:
        reason = ("per-API powers predicted unseen sensor intervals worse than one power for "
                  "all calls, so every call is charged alike")
    else:
        reason = (f"per-API powers predicted unseen sensor intervals only {gain:.1%} better "
                  f"than one power for all calls (at least {CV_MIN_GAIN:.0%} is needed), so "
                  "every call is charged alike")
    return IntensityFit(
        intensity, sig, pooled, busy, distinct, supported, reason, gain, wald_p, rel,
        int(m.shape[0]), own, capped, float(ceiling_W),
    )


def _with_reason(fit: IntensityFit, reason: str) -> IntensityFit:
    return IntensityFit(**{**fit.__dict__, "reason": reason})


def _cv_gain(m: np.ndarray, y: np.ndarray, pooled: float, ridge: float, folds: int) -> float:
    """1 − (held-out squared error with fitted intensities) / (with one pooled intensity)."""
    fold = np.arange(y.size) % folds
    err_fit = err_pool = 0.0
    for f in range(folds):
        train, test = fold != f, fold == f
        mt, yt = m[train], y[train]
        if mt.sum() <= 0 or not test.any():
            continue
        ok = mt.sum(axis=0) > 0
        pool = float(yt.sum() / mt.sum())
        x = np.full(m.shape[1], pool)
        if ok.sum() >= 1:
            x[ok], _ = _ridge_nnls(mt[:, ok], yt, pool, ridge)
        err_fit += float(((y[test] - m[test] @ x) ** 2).sum())
        err_pool += float(((y[test] - m[test].sum(axis=1) * pool) ** 2).sum())
    return 1.0 - err_fit / err_pool if err_pool > 0 else 0.0


# -- attribution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attribution:
    """Per call (arrays in input order) and per run (floats), for one sensor.

    energy_J: inclusive energy above idle; self_energy_J: the call's own (leaf) part;
    energy_total_J: inclusive energy with the call's share of idle power (idle W × its leaf time,
    concurrent threads splitting wall time); uncertainty_J: 1σ of energy_J, from sharing_J (the
    part of energy_J that rests on how an interval is shared, scaled by rel_spread) and
    measurement_J (the sensor's own error), see `_uncertainty` and `group_uncertainty`;
    below_resolution: shorter than the sensor's update period; covered: the call lies inside the
    sensor's intervals (uncovered parts get no energy); parent/depth: nesting.
    total_J: the sensor's energy over its intervals; idle_J: idle power × their length;
    above_idle_J = in_calls_J + outside_calls_J exactly; in_calls_total_J and
    outside_calls_total_J: the same with idle power included (their sum is total_J); tail_J:
    above-idle energy of the intervals after the last call ended (part of outside_calls_J).
    """

    energy_J: np.ndarray
    self_energy_J: np.ndarray
    energy_total_J: np.ndarray
    uncertainty_J: np.ndarray
    sharing_J: np.ndarray
    measurement_J: np.ndarray
    below_resolution: np.ndarray
    covered: np.ndarray
    parent: np.ndarray
    depth: np.ndarray
    total_J: float
    idle_W: float
    idle_J: float
    above_idle_J: float
    in_calls_J: float
    in_calls_total_J: float
    outside_calls_J: float
    outside_calls_total_J: float
    tail_J: float
    period_s: float
    method: str
    fell_back: bool
    rel_spread: float
    fit: IntensityFit | None


def _group_weights(
    method: str, fit: IntensityFit | None, leaf: np.ndarray, above: np.ndarray,
    lengths: np.ndarray, ceiling_W: float,
) -> tuple[np.ndarray, IntensityFit | None, bool]:
    """Each API's relative power for `method` (all 1 by overlap), the fit they came from, and
    whether "auto" fell back to overlap because the fit was not supported by the data."""
    weights = np.ones(leaf.shape[1])  # leaf: intervals × APIs
    if method == "overlap":
        return weights, fit, False
    if fit is None:
        fit = fit_intensities(leaf, above, lengths_s=lengths, ceiling_W=ceiling_W)
    if method != "intensity" and not fit.supported:
        return weights, fit, True
    return (fit.intensity_W / fit.pooled_W if fit.pooled_W > 0 else weights), fit, False


def attribute(
    intervals: SensorIntervals,
    t_start_ns: np.ndarray,
    t_end_ns: np.ndarray,
    *,
    idle_W: float,
    thread: np.ndarray | None = None,
    group: np.ndarray | None = None,
    method: str = "overlap",
    fit: IntensityFit | None = None,
    rel_spread: float = DEFAULT_REL_SPREAD,
    ngroups: int | None = None,
    nest: tuple[np.ndarray, np.ndarray] | None = None,
    ceiling_W: float = np.inf,
    leaf: np.ndarray | None = None,
    placed: Placed | None = None,
) -> Attribution:
    """Share each sensor interval's above-idle energy among the calls active in it.

    group: the API index of each call, < ngroups (for intensities; overlap ignores it).
    method: "overlap" (every active call draws alike), "intensity" (overlap × the group's
    fitted intensity, or `fit` when given) or "auto" (intensity when `fit_intensities` says the
    data support it, else overlap, flagged in `fell_back`). rel_spread: how far the power of the
    activities sharing an interval may differ from what the method assumes (relative, 1σ), for
    the uncertainty. nest: (parent, depth) from `nesting`, when already known. ceiling_W: the
    most any activity can draw above idle (the model's or the sensor's maximum): the fit's cap,
    and no call is given more power than it (`capped_rates`). leaf: `leaf_time` of these calls
    over these intervals, when already known (sensors read at the same instants share it);
    placed: these calls (their ends never before their starts) among these edges, likewise.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, not {method!r}")
    t0 = np.asarray(t_start_ns, np.int64)
    t1 = np.maximum(np.asarray(t_end_ns, np.int64), t0)
    n = t0.size
    grp = np.zeros(n, np.int64) if group is None else np.asarray(group, np.int64)
    if ngroups is None:
        ngroups = int(grp.max()) + 1 if n else 1
    parent, depth = nesting(t0, t1, thread) if nest is None else nest
    edges = intervals.edges_ns
    lengths = intervals.lengths_s
    above = intervals.energy_J - idle_W * lengths
    placed = placed or Placed.of(edges, t0, t1)
    if leaf is None:
        leaf = leaf_time(edges, t0, t1, grp, parent, ngroups, placed)

    weights, fit, fell_back = _group_weights(method, fit, leaf, above, lengths, ceiling_W)
    used = "intensity" if (method != "overlap" and not fell_back) else "overlap"

    d = leaf @ weights
    h = np.divide(above, d, out=np.zeros_like(above), where=d > 0)
    rates = capped_rates(above, leaf, weights, ceiling_W)
    call_weight = weights[grp] if (weights != 1).any() else 1.0  # overlap: alike
    w = leaf.sum(axis=1)
    union = placed.busy_s
    q = np.divide(idle_W * union, w, out=np.zeros_like(w), where=w > 0)
    self_e, idle_self = _own_integrals(edges, placed, parent, (h if rates is None else rates, q),
                                       grp, call_weight)
    # energy no call could draw at the ceiling stays outside the calls
    in_calls = float(above[d > 0].sum()) if rates is None else float(self_e.sum())
    levels = _levels(parent, depth)
    inclusive = _inclusive(self_e, levels)
    idle_share = _inclusive(idle_self, levels)

    sharing, measurement = _uncertainty(intervals, above, h, call_weight, t0, t1, placed)
    top = parent < 0
    after_last = edges[:-1] >= (t1.max() if n else edges[0])
    covered = (t0 >= edges[0]) & (t1 <= edges[-1]) & (intervals.count > 0)
    return Attribution(
        energy_J=inclusive,
        self_energy_J=self_e,
        energy_total_J=inclusive + idle_share,
        uncertainty_J=np.hypot(rel_spread * sharing, measurement),
        sharing_J=sharing,
        measurement_J=measurement,
        below_resolution=(t1 - t0) / NS < intervals.period_s,
        covered=covered,
        parent=parent,
        depth=depth,
        total_J=intervals.total_J,
        idle_W=float(idle_W),
        idle_J=float(idle_W * lengths.sum()),
        above_idle_J=float(above.sum()),
        in_calls_J=in_calls,
        in_calls_total_J=float(inclusive[top].sum() + idle_share[top].sum()),
        outside_calls_J=float(above.sum() - in_calls),
        outside_calls_total_J=float(
            above.sum() - in_calls + idle_W * (lengths.sum() - union.sum())
        ),
        tail_J=float(above[after_last & (d <= 0)].sum()),
        period_s=intervals.period_s,
        method=used,
        fell_back=fell_back,
        rel_spread=float(rel_spread),
        fit=fit,
    )


def capped_rates(
    above: np.ndarray, leaf: np.ndarray, weights: np.ndarray, ceiling_W: float
) -> np.ndarray | None:
    """(K, ngroups) power of each group's calls in each interval, none above ceiling_W: the
    interval's energy shared by weight as `attribute` does, a group whose share would exceed
    the ceiling held at it and the rest shared among the others (water-filling); what no group
    can take at the ceiling is left to no call. None when no group reaches the ceiling (the
    weights alone then decide, at a fraction of the cost)."""
    if not math.isfinite(ceiling_W) or leaf.size == 0:
        return None
    present = leaf > 0
    d = leaf @ weights
    h = np.divide(above, d, out=np.zeros_like(above), where=d > 0)
    rate = h[:, None] * weights[None, :]
    if not (present & (rate > ceiling_W)).any():
        return None
    capped = np.zeros(leaf.shape, bool)
    for _ in range(leaf.shape[1]):  # each round caps at least one more group, or stops
        capped |= present & (rate > ceiling_W)
        free = (leaf * ~capped) @ weights
        rest = above - ceiling_W * (leaf * capped).sum(axis=1)
        lam = np.divide(rest, free, out=np.zeros_like(rest), where=free > 0)
        rate = np.where(capped, ceiling_W, lam[:, None] * weights[None, :])
        if not (present & ~capped & (rate > ceiling_W)).any():
            break
    return rate


def _own_integrals(
    edges: np.ndarray, placed: Placed, parent: np.ndarray, rates: tuple[np.ndarray, np.ndarray],
    grp: np.ndarray, weight: np.ndarray | float,
) -> tuple[np.ndarray, np.ndarray]:
    """(self energy, idle share of the leaf time) of each call: `_self_integral` of the
    above-idle rate (one per interval, times each call's weight; or per interval and group,
    `_self_by_group`) and of the idle rate, the calls' children found once for both."""
    start, end = placed.start, placed.end
    child = parent >= 0
    kids = (child, parent[child])
    rate, idle = rates
    own = (weight * _self_integral(edges, rate, start, end, kids) if rate.ndim == 1
           else _self_by_group(edges, rate, start, end, kids, grp))
    return own, _self_integral(edges, idle, start, end, kids)


def _self_by_group(
    edges: np.ndarray, rates: np.ndarray, start: Instants, end: Instants,
    kids: tuple[np.ndarray, np.ndarray], grp: np.ndarray,
) -> np.ndarray:
    """`_self_integral` with a rate per interval and group: each call at its own group's."""
    out = np.zeros(grp.size)
    child, up = kids
    for g in np.unique(grp):
        span = end.integral(edges, rates[:, g]) - start.integral(edges, rates[:, g])
        own = span - np.bincount(up, span[child], minlength=span.size)
        mine = grp == g
        out[mine] = own[mine]
    return out


def cumulative(edges: np.ndarray, rate: np.ndarray, t: np.ndarray) -> np.ndarray:
    """∫ rate dt from the first edge to each t (rate constant per interval, 0 outside); with
    rate = `SensorIntervals.power_W` it is the sensor's energy, interpolated in time."""
    if rate.size == 0:
        return np.zeros(t.size)
    return Instants.of(edges, t).integral(edges, rate)


def _self_integral(
    edges: np.ndarray, rate: np.ndarray, start: Instants, end: Instants,
    kids: tuple[np.ndarray, np.ndarray],
) -> np.ndarray:
    """∫ rate over each call's leaf time: its span minus its direct children's spans (kids: which
    calls have a parent, and their parents)."""
    span = end.integral(edges, rate) - start.integral(edges, rate)
    child, up = kids
    return span - np.bincount(up, span[child], minlength=span.size)


def _levels(parent: np.ndarray, depth: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(calls, their parents) of each nesting level below the top, deepest first: the order in
    which `_inclusive` pushes values up."""
    if depth.size == 0:
        return []
    return [(idx, parent[idx]) for idx in (np.flatnonzero(depth == d)
                                           for d in range(int(depth.max()), 0, -1))]


def _inclusive(self_values: np.ndarray, levels: list[tuple[np.ndarray, np.ndarray]]
               ) -> np.ndarray:
    """Self + all descendants: push values up one nesting level at a time, deepest first."""
    total = self_values.copy()
    for idx, up in levels:
        np.add.at(total, up, total[idx])
    return total


def _uncertainty(
    intervals: SensorIntervals, above: np.ndarray, h: np.ndarray, weight: np.ndarray | float,
    t0: np.ndarray, t1: np.ndarray, placed: Placed | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(sharing, measurement) per call, from the intervals where the call starts and ends
    (`placed`: the calls among these edges, when known); weight: each call's relative power
    (1.0: all alike).

    Intervals the call fills entirely are its own (no sharing error) and their shared edges cancel
    between neighbours. In the first and last interval the call gets energy e from a share of the
    interval. *sharing*: e × (1 − the fraction of the interval the call fills): the energy that
    depends on the rest of the interval (other calls, idle time) drawing what the method
    assumes; times a relative spread it is a 1σ. *measurement*: the interval's energy is
    uncertain by its edges' timing (above-idle power × edge σ) and the counter's quantum; the
    call carries its share e / above of that. Both add in quadrature over the two intervals.
    """
    edges = intervals.edges_ns
    if intervals.count == 0 or t0.size == 0:
        return np.zeros(t0.size), np.zeros(t0.size)
    lengths = np.diff(edges) / NS
    geo = (placed or Placed.of(edges, t0, np.maximum(t1, t0))).edge_parts
    power_above = np.divide(above, lengths, out=np.zeros_like(above), where=lengths > 0)
    sig_edge = intervals.edge_sigma_ns / NS
    meas = np.sqrt(
        (power_above * sig_edge[:-1]) ** 2 + (power_above * sig_edge[1:]) ** 2
        + intervals.quantum_J**2 / 6
    )
    sharing, measurement = _edge_terms(above, h, meas, weight, geo.first, geo.first_s,
                                       geo.first_unfilled)
    last = _edge_terms(above, h, meas, weight if np.ndim(weight) == 0 else weight[geo.cross],
                       geo.last, geo.last_s, geo.last_unfilled)
    sharing[geo.cross] += last[0]
    measurement[geo.cross] += last[1]
    return np.sqrt(sharing), np.sqrt(measurement)


def _edge_terms(above: np.ndarray, h: np.ndarray, meas: np.ndarray, weight: np.ndarray | float,
                idx: np.ndarray, part: np.ndarray, unfilled: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """The squared sharing and measurement terms of calls' parts `part` s long in intervals
    `idx` (`_uncertainty`)."""
    e = weight * h[idx] * part
    share = np.divide(e, above[idx], out=np.zeros_like(e), where=above[idx] != 0)
    return (e * unfilled) ** 2, (share * meas[idx]) ** 2


def group_uncertainty(res: Attribution, members: np.ndarray, group: int | None = None) -> float:
    """1σ of the summed energy_J of the calls in `members` (a mask or indices): `group_sigma`
    of their sharing and measurement parts."""
    return group_sigma(float(np.abs(res.sharing_J[members]).sum()),
                       float((res.measurement_J[members] ** 2).sum()), res, group)


def group_sigma(shared: float, measurement_sq: float, res: Any,
                group: int | None = None) -> float:
    """1σ of a group's summed energy from Σ |sharing_J| and Σ measurement_J² of its calls (sums
    that merge over chunks).

    Measurement errors are independent between calls and add in quadrature. Sharing errors are
    not: if an API draws more than assumed, all its calls are off the same way. So the sharing
    parts add linearly, times a relative error for the group: with intensities, the group's
    intensity σ / intensity; with overlap and a fit, how far the fit puts the group from the
    pooled mean (what assuming equal power gets wrong), at least its σ; else rel_spread.
    """
    meas = math.sqrt(measurement_sq)
    fit = res.fit
    rel = res.rel_spread
    if fit is not None and group is not None and fit.pooled_W > 0 and np.isfinite(
        fit.sigma_W[group]
    ):
        if res.method == "intensity":
            rel = float(fit.sigma_W[group] / max(fit.intensity_W[group], 1e-12))
        else:
            rel = float(max(abs(fit.intensity_W[group] - fit.pooled_W), fit.sigma_W[group])
                        / fit.pooled_W)
    return float(np.hypot(rel * shared, meas))
