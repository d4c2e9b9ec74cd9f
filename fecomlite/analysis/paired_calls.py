"""Two runs' calls paired by site and call order, for `fecomlite report A B`.

Where the runs share code, the k-th call of a site in run B is the same call as the k-th call of
that site in run A: the same shapes, the same place in the training loop (the first, with its
first-use work, against the first). An API's energy per call is then compared over the calls the
two runs have in common: for each site, the first K calls of every repetition, K the fewest
calls any repetition of either run made there. Between-call differences (a costly first call,
a longer last batch) are the same on both sides and cancel; a run that made more calls (more
epochs, a longer loop) is not compared on calls the other never made. A site only one run has,
or one a repetition never called, is left out of the pairing; an API with no paired call is
compared unpaired (`report.compare.per_rep_per_call`), as the sequences differ.

Each repetition's mean energy per paired call is what the comparison tests (the repetitions carry
the run-to-run variation a second run would show); the paired per-call changes are kept as a
distribution (quartiles of B/A − 1 per paired call, each averaged over repetitions), capped at
SAMPLE_PER_SITE calls per site so that a long run's pairing stays small.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fecomlite.analysis import pieces

SAMPLE_PER_SITE = 4096  # paired calls per site kept for the per-call distribution
SIMILAR_CALLS = 10.0  # APIs within this factor of calls per repetition share a typical spread


@dataclass
class RunCalls:
    """One run's calls (first pieces), each with its site, repetition and position k among its
    site's calls in its repetition; `energy` per domain, the call's pieces summed."""

    site: np.ndarray  # index into keys
    rep: np.ndarray
    order: np.ndarray
    energy: dict[str, np.ndarray]
    keys: list[str]
    reps: list[int]


def run_calls(calls: dict[str, Any], keys: list[str], reps: list[int],
              domains: list[str]) -> RunCalls:
    """The calls of an analysis (`RunAnalysis.calls`, `site_keys`) ordered for pairing."""
    heads = np.asarray(calls["call"], np.int64)
    n = heads.size
    head = heads == np.arange(n)
    site, rep = calls["site"][head], calls["rep"][head]
    order = np.lexsort((calls["t_start_ns"][head], rep, site))
    s, r = site[order], rep[order]
    new = np.ones(s.size, bool)
    new[1:] = (s[1:] != s[:-1]) | (r[1:] != r[:-1])
    start = np.maximum.accumulate(np.where(new, np.arange(s.size), 0))
    k = np.empty(s.size, np.int64)
    k[order] = np.arange(s.size) - start
    energy = {d: np.bincount(heads, weights=calls["energy_J"][d], minlength=n)[head]
              for d in domains if d in calls["energy_J"]}
    return RunCalls(np.asarray(site, np.int64), np.asarray(rep, np.int64), k, energy,
                    list(keys), list(reps))


def _counts(x: RunCalls) -> dict[str, int]:
    """Site key → the fewest calls any repetition made there (0 if one made none)."""
    table = np.zeros((len(x.keys), max(len(x.reps), 1)), np.int64)
    where = {r: i for i, r in enumerate(x.reps)}
    col = np.array([where.get(int(r), -1) for r in x.rep], np.int64) if x.rep.size else x.rep
    ok = col >= 0
    np.add.at(table, (x.site[ok], col[ok]), 1)
    return {key: int(table[i].min()) for i, key in enumerate(x.keys)}


def limits(a: RunCalls, b: RunCalls) -> dict[str, int]:
    """Site key → K, the calls paired per repetition (sites with none are absent)."""
    ca, cb = _counts(a), _counts(b)
    return {k: min(ca[k], cb[k]) for k in ca.keys() & cb.keys() if min(ca[k], cb[k]) > 0}


def per_rep_means(x: RunCalls, domain: str, paired: dict[str, int],
                  api_of: dict[str, str]) -> dict[str, tuple[np.ndarray, int]]:
    """API → (each repetition's mean energy per paired call, paired calls per repetition)."""
    apis = sorted({api_of[k] for k in paired if k in api_of})
    index = {api: i for i, api in enumerate(apis)}
    site_api = np.array([index.get(api_of.get(k, ""), -1) if k in paired else -1
                         for k in x.keys], np.int64)
    cap = np.array([paired.get(k, 0) for k in x.keys], np.int64)
    where = {r: i for i, r in enumerate(x.reps)}
    col = np.array([where.get(int(r), -1) for r in x.rep], np.int64)
    use = (x.order < cap[x.site]) & (site_api[x.site] >= 0) & (col >= 0)
    cell = site_api[x.site[use]] * len(x.reps) + col[use]
    sums = np.bincount(cell, weights=x.energy[domain][use], minlength=len(apis) * len(x.reps))
    per_api = np.bincount(site_api[site_api >= 0], weights=cap[site_api >= 0],
                          minlength=len(apis))
    return {api: (sums[i * len(x.reps):(i + 1) * len(x.reps)] / per_api[i], int(per_api[i]))
            for api, i in index.items()}


def _call_means(x: RunCalls, domain: str, site: int, count: int) -> np.ndarray:
    """The first `count` calls of a site, each its mean energy over the repetitions."""
    mine = (x.site == site) & (x.order < count) & np.isin(x.rep, x.reps)
    sums = np.bincount(x.order[mine], weights=x.energy[domain][mine], minlength=count)
    return sums / max(len(x.reps), 1)


def call_changes(a: RunCalls, b: RunCalls, domain: str, paired: dict[str, int],
                 api_of: dict[str, str]) -> dict[str, list[float]]:
    """API → quartiles of the paired calls' relative change B/A − 1 (calls whose energy in A
    is not above zero are left out)."""
    ia = {k: i for i, k in enumerate(a.keys)}
    ib = {k: i for i, k in enumerate(b.keys)}
    changes: dict[str, list[np.ndarray]] = {}
    for key, count in paired.items():
        if key not in api_of:
            continue
        n = min(count, SAMPLE_PER_SITE)
        ea, eb = _call_means(a, domain, ia[key], n), _call_means(b, domain, ib[key], n)
        ok = ea > 0
        changes.setdefault(api_of[key], []).append(eb[ok] / ea[ok] - 1)
    return {api: np.quantile(np.concatenate(parts), [0.25, 0.5, 0.75]).tolist()
            for api, parts in changes.items() if sum(p.size for p in parts)}


def pair_runs(a: Any, b: Any, domains: list[str],
              reps: tuple[list[int], list[int]] | None = None
              ) -> dict[tuple[str, str], dict[str, Any]]:
    """(API, domain) → the paired comparison's inputs for two analyses (`RunAnalysis`):
    reps_a, reps_b (each repetition's mean energy per paired call), calls (paired calls per
    repetition) and per_call_change (quartiles of the paired calls' B/A − 1). reps: the
    repetitions of each run compared (None: all of them)."""
    reps_a, reps_b = reps or ([int(r["rep"]) for r in a.repetitions],
                              [int(r["rep"]) for r in b.repetitions])
    ca = run_calls(a.calls, a.site_keys, reps_a, domains)
    cb = run_calls(b.calls, b.site_keys, reps_b, domains)
    paired = limits(ca, cb)
    api_of = {s["key"]: s["api"] for s in (*a.sites, *b.sites) if s.get("api")}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for d in domains:
        if d not in ca.energy or d not in cb.energy:
            continue
        ma, mb = per_rep_means(ca, d, paired, api_of), per_rep_means(cb, d, paired, api_of)
        quartiles = call_changes(ca, cb, d, paired, api_of)
        for api in ma.keys() & mb.keys():
            out[(api, d)] = {"reps_a": ma[api][0], "reps_b": mb[api][0],
                             "calls": ma[api][1], "per_call_change": quartiles.get(api)}
    return out


def spreads(pairs: dict[tuple[str, str], dict[str, Any]], domain: str
            ) -> list[tuple[float, float, int]]:
    """(paired calls per repetition, relative variance between the repetitions' energy per
    paired call, its degrees of freedom) of each paired API of both runs with two repetitions
    or more."""
    return [(float(p["calls"]), float(reps.var(ddof=1)) / float(reps.mean()) ** 2, reps.size - 1)
            for (_, d), p in pairs.items() if d == domain
            for reps in (p["reps_a"], p["reps_b"]) if reps.size > 1 and reps.mean() > 0]


def typical_variance(values: list[tuple[float, float, int]], calls: float | None = None) -> float:
    """The typical relative variance of the APIs that make about as many calls per repetition
    as `calls` (within SIMILAR_CALLS×; all of them when None), NaN with fewer than three: a call
    made once a repetition varies between repetitions far more than the mean of a loop's
    hundred calls, so a loop's spread is no prior for it. Pooled by degrees of freedom, not a
    median: the median of variances from two or three repetitions each lies well below their
    mean (for one degree of freedom, at 0.45 of it), which would call noise a change."""
    near = [(v, dof) for n, v, dof in values if calls is None
            or (n > 0 and calls > 0 and max(n / calls, calls / n) <= SIMILAR_CALLS)]
    if len(near) < 3:
        return float("nan")
    return sum(v * dof for v, dof in near) / sum(dof for _, dof in near)


def typical_spread(pairs: dict[tuple[str, str], dict[str, Any]], domain: str,
                   calls: float | None = None) -> float:
    """The prior that moderates an API's own spread (`report.compare.across_repetitions`):
    `typical_variance` of the paired APIs' `spreads`."""
    return typical_variance(spreads(pairs, domain), calls)


# -- streamed runs: paired calls read chunk by chunk from the store ---------------------------


@dataclass
class ChunkedCalls:
    """A streamed run's calls as the pairing needs them, summed while reading its chunks:
    `counts` (site key → calls per repetition), then per site and repetition the paired calls'
    time (`paired_s`), per site the first calls' time averaged over repetitions (`sample_s`),
    per (API, repetition) all calls' time (`api_s`)."""

    keys: list[str]
    reps: list[int]
    api_of_site: list[str]
    counts: np.ndarray  # (sites, reps)
    paired_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (sites, reps)
    sample_s: dict[int, np.ndarray] = field(default_factory=dict)
    api_s: dict[str, np.ndarray] = field(default_factory=dict)


def _walk(store: Any, run_id: int, sites: list[dict[str, Any]], reps: list[int],
          visit: Any) -> None:
    """Each chunk's call starts (first pieces) as (site index, repetition index, order k among
    the site's calls in its repetition, duration s): chunks come by repetition and start
    (`StoreReads.event_chunks`), so k counts on across them."""
    where = {r: i for i, r in enumerate(reps)}
    ids = np.array([s["id"] for s in sites], np.int64)  # the store's order: by id
    seen = np.zeros((len(sites), len(reps)), np.int64)
    for cols in store.event_chunks(run_id):
        col = where.get(int(cols["rep"][0]), -1)
        if col < 0:
            continue
        head = pieces.is_call(cols["status"])
        site = np.searchsorted(ids, cols["site_id"][head])
        order = np.argsort(site, kind="stable")
        ranked = np.empty(site.size, np.int64)
        bounds = np.searchsorted(site[order], np.arange(len(sites) + 1))
        for i in np.flatnonzero(np.diff(bounds)):
            ranked[order[bounds[i]:bounds[i + 1]]] = seen[i, col] + np.arange(
                bounds[i + 1] - bounds[i])
        np.add.at(seen[:, col], site, 1)
        seconds = (cols["t_end_ns"][head] - cols["t_start_ns"][head]) / 1e9
        visit(site, col, ranked, seconds)


def chunked_counts(store: Any, run_id: int, reps: list[int]) -> ChunkedCalls:
    """First pass over a streamed run: how many calls each site made in each repetition."""
    sites = store.sites(run_id)
    out = ChunkedCalls([s["key"] for s in sites], list(reps), [s["api"] for s in sites],
                       np.zeros((len(sites), len(reps)), np.int64))

    def visit(site: np.ndarray, col: int, ranked: np.ndarray, seconds: np.ndarray) -> None:
        np.add.at(out.counts[:, col], site, 1)

    _walk(store, run_id, sites, reps, visit)
    return out


def chunked_times(store: Any, run_id: int, x: ChunkedCalls, paired: dict[str, int]) -> None:
    """Second pass: the paired calls' time per site and repetition, the first calls' time per
    site (SAMPLE_PER_SITE at most, averaged over repetitions) and every call's per API."""
    cap = np.array([paired.get(k, 0) for k in x.keys], np.int64)
    x.paired_s = np.zeros(x.counts.shape)
    x.sample_s = {i: np.zeros(min(int(c), SAMPLE_PER_SITE)) for i, c in enumerate(cap) if c}
    x.api_s = {api: np.zeros(len(x.reps)) for api in set(x.api_of_site)}
    api_index = sorted(x.api_s)
    site_api = np.array([api_index.index(a) for a in x.api_of_site], np.int64)
    per_api = np.zeros((len(api_index), len(x.reps)))

    def visit(site: np.ndarray, col: int, ranked: np.ndarray, seconds: np.ndarray) -> None:
        np.add.at(per_api[:, col], site_api[site], seconds)
        use = ranked < cap[site]
        np.add.at(x.paired_s[:, col], site[use], seconds[use])
        kept = use & (ranked < SAMPLE_PER_SITE)
        for i in np.unique(site[kept]):
            mine = kept & (site == i)
            np.add.at(x.sample_s[int(i)], ranked[mine], seconds[mine] / len(x.reps))

    _walk(store, run_id, store.sites(run_id), x.reps, visit)
    for i, api in enumerate(api_index):
        x.api_s[api] = per_api[i]


def is_streamed(x: Any) -> bool:
    """Whether an analysis kept no call's columns (analysed streamed) though it has calls."""
    return len(x.calls.get("call", ())) == 0 and any(r["calls"] for r in x.apis)


def pair_streamed(store: Any, a: Any, b: Any, domains: list[str],
                  reps: tuple[list[int], list[int]]) -> dict[tuple[str, str], dict[str, Any]]:
    """`pair_runs` for runs of which one or both were analysed streamed (no call columns),
    reading the paired calls chunk by chunk from the store. A streamed run keeps no call's
    energy, so a paired call's is its time × its API's power in that repetition (the API's
    energy there over its calls' time): inside sensor intervals energy is apportioned by time,
    so the API's mean power stands for each of its calls' (a call recorded in pieces counts its
    first piece's time). Both runs are read this way, so that both sides are estimated alike."""
    xa = chunked_counts(store, int(a.run["id"]), reps[0])
    xb = chunked_counts(store, int(b.run["id"]), reps[1])
    ca = {k: int(xa.counts[i].min()) for i, k in enumerate(xa.keys)}
    cb = {k: int(xb.counts[i].min()) for i, k in enumerate(xb.keys)}
    paired = {k: min(ca[k], cb[k]) for k in ca.keys() & cb.keys() if min(ca[k], cb[k]) > 0}
    for x, run in ((xa, a), (xb, b)):
        chunked_times(store, int(run.run["id"]), x, paired)
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for d in domains:
        ea, eb = _streamed_means(xa, a, d, paired), _streamed_means(xb, b, d, paired)
        for api in ea.keys() & eb.keys():
            changes = [eb[api][2][k] / ea[api][2][k] - 1 for k in ea[api][2]
                       if k in eb[api][2]]
            flat = np.concatenate([c[np.isfinite(c)] for c in changes]) if changes else None
            out[(api, d)] = {"reps_a": ea[api][0], "reps_b": eb[api][0], "calls": ea[api][1],
                             "per_call_change": np.quantile(flat, [0.25, 0.5, 0.75]).tolist()
                             if flat is not None and flat.size else None}
    return out


def _streamed_means(x: ChunkedCalls, run: Any, domain: str, paired: dict[str, int]
                    ) -> dict[str, tuple[np.ndarray, int, dict[str, np.ndarray]]]:
    """API → (each compared repetition's mean energy per paired call, paired calls per
    repetition, site key → its first calls' energy averaged over repetitions)."""
    position = {int(r["rep"]): i for i, r in enumerate(run.repetitions)}
    cols = [position[r] for r in x.reps]
    rows = {r["api"]: r for r in run.apis}
    out = {}
    for api in sorted({x.api_of_site[i] for i, k in enumerate(x.keys) if k in paired}):
        energy = (rows.get(api, {}).get("energy") or {}).get(domain) or {}
        per_rep = energy.get("raw_per_rep_J") or energy.get("per_rep_J") or []
        if len(per_rep) < len(run.repetitions) or api not in x.api_s:
            continue
        time_s = x.api_s[api]
        power = np.array([float(per_rep[c]) for c in cols]) / np.where(time_s > 0, time_s, np.nan)
        mine = [i for i, k in enumerate(x.keys) if k in paired and x.api_of_site[i] == api]
        calls = sum(paired[x.keys[i]] for i in mine)
        means = x.paired_s[mine].sum(axis=0) * power / calls
        samples = {x.keys[i]: x.sample_s[i] * float(np.nanmean(power)) for i in mine}
        out[api] = (means, calls, samples)
    return out
