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

from dataclasses import dataclass
from typing import Any

import numpy as np

SAMPLE_PER_SITE = 4096  # paired calls per site kept for the per-call distribution


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
    mine = (x.site == site) & (x.order < count)
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


def pair_runs(a: Any, b: Any, domains: list[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """(API, domain) → the paired comparison's inputs for two analyses (`RunAnalysis`):
    reps_a, reps_b (each repetition's mean energy per paired call), calls (paired calls per
    repetition) and per_call_change (quartiles of the paired calls' B/A − 1)."""
    reps_a = [int(r["rep"]) for r in a.repetitions]
    reps_b = [int(r["rep"]) for r in b.repetitions]
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


def typical_spread(pairs: dict[tuple[str, str], dict[str, Any]], domain: str) -> float:
    """The median over the paired APIs of both runs of their relative variance between
    repetitions' energy per paired call (NaN with fewer than three APIs of two repetitions or
    more): the prior that moderates each API's own spread (`report.compare.across_repetitions`)."""
    values = [float(reps.var(ddof=1)) / float(reps.mean()) ** 2
              for (_, d), p in pairs.items() if d == domain
              for reps in (p["reps_a"], p["reps_b"]) if reps.size > 1 and reps.mean() > 0]
    return float(np.median(values)) if len(values) >= 3 else float("nan")
