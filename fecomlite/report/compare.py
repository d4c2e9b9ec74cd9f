"""Two runs side by side (before and after a change): per API and energy domain, the difference
and whether it is larger than the noise.

Noise is read from the runs' own 95 % confidence intervals: for independent estimates the
half-width of the difference's interval is √(hA² + hB²), so a change counts as real when
|B − A| exceeds it. Two figures are compared: the mean energy per call (the cost of one call)
and the API's energy per repetition (its cost in the program, call counts included). A domain
measured in one run and estimated in the other, or estimated by different models, is not
compared: the difference would be the sensors', not the program's. Nor is a domain attributed by
different methods (`analyse_pair` attributes both runs again by overlap when `auto` chose
differently, nor a domain `auto` fitted intensities for: both runs are then attributed by
overlap), nor a machine-level domain on a machine other processes kept busy.

Energy per call, with two repetitions or more in both runs: compared over the repetitions'
energy per call, of the calls paired by site and call order where the runs share them (the k-th
call of a site in A against its k-th in B, `analysis.paired_calls`; unpaired where the call
sequences differ) (`across_repetitions`: Student's t, each API's spread moderated by the typical
one of APIs making as many calls (`paired_calls.typical_variance`), family-wise 5 % over the
page's APIs and domains, the minimum detectable change and the repetitions a 10 % change needs
beside it; under intensities, each run's fit error of the API joins the noise, `fit_sigma`).
Where the machine's speed drifts between repetitions (every API dearer or cheaper together),
each API's change is judged also beyond the runs' common change against the spread left once
that factor is removed, with the APIs' own scatter between the two runs in the noise of both
tests (`analysis.repetition_factor`, `_beyond_factor`; each test at half the error rate); a
change every API shares is "no verdict: moved with every API", on the API and the domain
(`_with_every_api`): a program dearer throughout and a machine slower between the runs look
alike from one pair. Repetitions load distorted are left out when each run keeps two that it did not
(`compared_repetitions`). Host domains of runs whose load differed over the compared
repetitions (`analysis.contention.load_differs`) are "not comparable: load", with the reason.
Otherwise (and for the energy per repetition):

The noise of an API's figure adds, to its CI across calls or repetitions, the attribution's own
uncertainty (how its energy was shared inside sensor intervals) and the run-to-run spread of the
domain (the CI of the program's energy per repetition, relative): calls within one run do not
show how much a second run would differ. Without two repetitions in either run that spread is
unknown and no verdict is given.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import time
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from fecomlite.analysis import repetition_factor, units
from fecomlite.analysis.contention import (
    DISTORTION_LIMIT,
    load_differs,
    over_repetitions,
    quiet_repetitions,
)
from fecomlite.analysis.distributions import t_quantile
from fecomlite.analysis.paired_calls import (
    is_streamed,
    pair_runs,
    pair_streamed,
    spreads,
    typical_variance,
)
from fecomlite.analysis.run_analysis import HOST_DOMAINS, RunAnalysis, analyse_run, mean_ci95
from fecomlite.report import tables
from fecomlite.report.palette import domain_color, domain_name, shade

TOP_BARS = 15
TOP_CHANGED = 10  # APIs named per domain in the terminal
NOT_COMPARABLE = "not comparable"
NOT_COMPARABLE_LOAD = "not comparable: load"
NOT_IDENTIFIED = "no verdict: below the sensors' resolution"
NOT_FITTED = "no verdict: power not identified"
WITH_EVERY_API = "no verdict: moved with every API"
SUB_RESOLUTION = 0.1  # a call shorter than this share of a sensor reading cannot be resolved
MIN_CALLS_RESOLVED = 5  # ... unless this many a repetition average over several readings
POWER_Z = 0.8416  # 80 % power: a change this many σ beyond the 5 % threshold is detected
TARGET_CHANGE = 0.10  # the change a user would want to see: repetitions needed for it
FAMILY_ALPHA = 0.05  # the chance of any false verdict over all of a comparison's APIs
PRIOR_DOF = 4  # how many repetitions' worth the domain's typical spread counts for


@dataclass
class Comparison:
    """`context` for compare.html.j2, `charts` for its scripts, `json` and `csv` for the files."""

    context: dict[str, Any]
    charts: dict[str, Any]
    json: dict[str, Any]
    csv: dict[str, str]


def half_width(low: Any, high: Any) -> float:
    if low is None or high is None:
        return math.nan
    return (float(high) - float(low)) / 2


def difference(a: float, ha: float, b: float, hb: float) -> dict[str, Any]:
    """B − A, its relative size, the noise (95 % half-width of the difference) and a verdict."""
    if not (math.isfinite(a) and math.isfinite(b)):
        return {"diff": math.nan, "rel": math.nan, "noise": math.nan, "verdict": "missing"}
    diff = b - a
    rel = diff / abs(a) if a else math.nan
    noise = math.sqrt(ha**2 + hb**2) if math.isfinite(ha) and math.isfinite(hb) else math.nan
    if not math.isfinite(noise):
        verdict = "too few values"
    elif abs(diff) > noise:
        verdict = "higher" if diff > 0 else "lower"
    else:
        verdict = "within noise"
    return {"diff": diff, "rel": rel, "noise": noise, "verdict": verdict}


def _comparable(da: dict[str, Any] | None, db: dict[str, Any] | None) -> tuple[bool, str]:
    if da is None or db is None:
        return False, "only in run " + ("B" if da is None else "A")
    if da["provenance"] != db["provenance"]:
        return False, f"{da['provenance']} in A, {db['provenance']} in B"
    if (da.get("model") or "") != (db.get("model") or ""):
        return False, f"models differ: {da.get('model')} / {db.get('model')}"
    if da.get("method") != db.get("method"):
        return False, (f"attributed by {da.get('method')} in A and {db.get('method')} in B: "
                       "the difference would be the methods'")
    unreliable = [f"in run {side}, {'; '.join(d.get('unreliable') or ['it is unreliable'])}"
                  for side, d in (("A", da), ("B", db)) if not d.get("reliable", True)]
    if unreliable:
        return False, "its above-idle figures are unreliable: " + "; ".join(unreliable)
    return True, da["provenance"]


def analyse_pair(
    store: Any, run_a: int, run_b: int, method: str = "auto"
) -> tuple[RunAnalysis, RunAnalysis, list[str]]:
    """Both runs analysed alike, by a method whose assumption is the same in both: when `auto`
    chose intensities for a domain in either run, both are attributed again by overlap, and a
    note says why. An intensity fit is made per run: its own error (±30 % per API is common on
    a CPU estimate) is the same in every repetition of that run, so two runs' fits differ by
    more than their repetitions show (issue 30: one-off µs calls read 4 µJ in every repetition
    of one run and 6 mJ in every repetition of the next, from the fit alone). By overlap, both
    runs share each sensor interval's energy by the calls' time alike, and a call's change is
    its time's and its intervals' power's."""
    a, b = analyse_run(store, run_a, method), analyse_run(store, run_b, method)
    ma = {d["domain"]: d["method"] for d in a.domains}
    mb = {d["domain"]: d["method"] for d in b.domains}
    refit = sorted(k for k in ma.keys() & mb.keys() if "intensity" in (ma[k], mb[k]))
    if method != "auto" or not refit:
        return a, b, []
    note = ("Both runs were attributed again by overlap (" + "; ".join(
        f"{k}: {ma[k]} in A, {mb[k]} in B" for k in refit) + "): intensities are fitted per run, "
        "and a fit's own error, the same in every repetition of its run, would read as a "
        "change between runs.")
    return analyse_run(store, run_a, "overlap"), analyse_run(store, run_b, "overlap"), [note]


def run_differences(a: RunAnalysis, b: RunAnalysis) -> list[str]:
    """What differs between the two runs besides the program's behaviour: program, command,
    settings, hyperparameters, machine, sensors, instrumented sources, repetitions."""
    ra, rb = a.run, b.run
    out = []
    for key, label in (("program", "program"), ("argv", "command"), ("level", "level")):
        if ra.get(key) != rb.get(key):
            out.append(f"{label}: {ra.get(key)!r} in A, {rb.get(key)!r} in B")
    for key, label in (("settings", "settings"), ("hyperparams", "hyperparameters"),
                       ("machine", "machine"), ("manifest", "instrumented program")):
        x, y = ra.get(key) or {}, rb.get(key) or {}
        keys = sorted(k for k in set(x) | set(y) if x.get(k) != y.get(k))
        if keys:
            out.append(f"{label}: {', '.join(map(str, keys[:8]))}"
                       + (f" and {len(keys) - 8} more" if len(keys) > 8 else "") + " differ")
    sa = {(s["name"], s.get("model")) for s in a.sensors}
    sb = {(s["name"], s.get("model")) for s in b.sensors}
    if sa != sb:
        out.append("sensors: " + ", ".join(
            [f"{n} only in A" for n, _ in sorted(sa - sb)]
            + [f"{n} only in B" for n, _ in sorted(sb - sa)]))
    if len(a.repetitions) != len(b.repetitions):
        out.append(f"repetitions: {len(a.repetitions)} in A, {len(b.repetitions)} in B")
    for side, r in (("A", a), ("B", b)):
        if (r.load or {}).get("busy"):
            out.append(f"run {side}: {r.load['text']}")
    return out


def per_rep_per_call(row: dict[str, Any], energy: dict[str, Any],
                     keep: list[int] | None = None) -> np.ndarray:
    """Each repetition's energy per call of the API (the raw estimates: noise keeps its sign):
    a deterministic program makes the same calls in every repetition, so these differ only by
    what differs between repetitions, not by how the API's calls differ from one another.
    keep: the positions of the repetitions compared (`quiet_repetitions`), None for all."""
    values = energy.get("raw_per_rep_J") or energy.get("per_rep_J") or []
    counts = row.get("per_rep_calls") or []
    pairs = list(zip(values, counts, strict=False))
    return np.array([v / c for i, (v, c) in enumerate(pairs)
                     if (keep is None or i in keep) and c and v is not None and math.isfinite(v)],
                    float)


def fit_sigma(x: RunAnalysis, domain: str, api: str, value: float) -> float:
    """1σ of an API's energy per call that every repetition of run `x` shares: under
    intensities, the fit's error of the API's intensity (σ / intensity × the figure); infinite
    where the fit did not identify the API's own power (it then rests on the power fitted to
    all such calls together: a few µs calls in 100 ms readings); 0 by overlap, which fits
    nothing (its equal-power assumption is the same in both runs)."""
    record = (x.intensities or {}).get(domain) or {}
    if record.get("method") != "intensity" or not math.isfinite(value):
        return 0.0
    fitted = (record.get("apis") or {}).get(api) or {}
    sigma, intensity = fitted.get("sigma_W", math.inf), fitted.get("intensity_W", 0.0)
    if not fitted.get("identifiable") or not math.isfinite(sigma) or not intensity:
        return math.inf
    return sigma / intensity * abs(value)


def across_repetitions(
    a: float, b: float, reps_a: np.ndarray, reps_b: np.ndarray,
    fit_a: float, fit_b: float, tests: int, prior: float = math.nan,
    residual: tuple[float, float] = (1.0, 1.0), shared_dof: float = math.inf,
) -> dict[str, Any]:
    """The energy per call of both runs compared over their repetitions (Student's two-sample
    t on the repetitions' per-call means, pooled variance), family-wise at 5 % over the
    comparison's `tests` (API, domain) pairs (Bonferroni), so that identical code gives no
    verdict. fit_a, fit_b: the 1σ each run's figure shares over all its repetitions
    (`fit_sigma`), which the repetitions' spread cannot show: it joins the standard error in
    quadrature (an infinite one gives no verdict). The attribution's sharing uncertainty
    does not: the random part of how an interval is shared differs from repetition to
    repetition and is in their spread; its systematic part (the method's assumption) is the
    same in both runs. With the verdict, the smallest change detected 80 % of the time and the
    repetitions a 10 % change needs. prior: the typical relative variance between repetitions
    of the APIs that make as many calls (`paired_calls.typical_variance`), which moderates this
    API's own (a moderated t: three repetitions alone say little about a spread). residual:
    for repetitions without their common factor (`analysis.repetition_factor`), (scale,
    dof_share): the spread left keeps dof_share of the degrees of freedom (t counts the whole
    ones left, and the prior is the typical spread left over its dof_share), and the
    difference of the means varies scale × dof_share × as much as that spread says.
    shared_dof: the degrees of freedom of fit_a and fit_b where they are estimated (the APIs'
    scatter between the runs, `repetition_factor.between_runs_dof`); t then counts those of
    the whole standard error (Welch–Satterthwaite)."""
    scale, dof_share = residual
    share = (reps_a.size + reps_b.size - 2) * dof_share
    variance = ((reps_a.size - 1) * reps_a.var(ddof=1)
                + (reps_b.size - 1) * reps_b.var(ddof=1)) / share
    if math.isfinite(prior) and a:  # moderated: the domain's typical spread as PRIOR_DOF more
        variance = (PRIOR_DOF * prior * a * a + share * variance) / (PRIOR_DOF + share)
        share += PRIOR_DOF
    variance *= scale * dof_share
    pooled = math.sqrt(variance)
    spread, fitted = variance * (1 / reps_a.size + 1 / reps_b.size), fit_a**2 + fit_b**2
    dof = max(1, math.floor(_satterthwaite((spread, share), (fitted, shared_dof))))
    crit = t_quantile(1 - FAMILY_ALPHA / (2 * max(tests, 1)), dof)
    standard_error = math.sqrt(spread + fitted)
    noise = crit * standard_error
    out = {"a": a, "b": b, "a_ci95": math.nan, "b_ci95": math.nan, "repetitions_compared":
           [int(reps_a.size), int(reps_b.size)], "threshold_t": crit,
           "fit_sigma": [fit_a, fit_b]}
    out.update(difference(a, 0.0, b, 0.0))
    out["noise"] = noise
    if not math.isfinite(noise):
        out.update(verdict=NOT_IDENTIFIED, min_detectable=math.nan, min_detectable_rel=math.nan,
                   reps_for_10pct=None)
        return out
    if math.isfinite(out["diff"]):
        out["verdict"] = ("higher" if out["diff"] > 0 else "lower") if abs(
            out["diff"]) > noise else "within noise"
    mdc = standard_error * (crit + t_quantile(0.8, dof))
    out["min_detectable"] = mdc
    out["min_detectable_rel"] = mdc / abs(a) if math.isfinite(a) and a else math.nan
    # with many repetitions t tends to the normal: the thresholds those repetitions would use
    z = NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * max(tests, 1))) + NormalDist().inv_cdf(0.8)
    out["reps_for_10pct"] = _reps_needed(z, pooled, math.hypot(fit_a, fit_b), a)
    return out


def _satterthwaite(first: tuple[float, float], *parts: tuple[float, float]) -> float:
    """The degrees of freedom of a sum of variances, each (variance, its dof): the first's
    where the others are known exactly (infinite dof) or not finite."""
    every = (first, *parts)
    total = sum(v for v, _ in every)
    spread = sum(v * v / dof for v, dof in every if v and dof > 0)
    return total * total / spread if spread and math.isfinite(total) else first[1]


def _reps_needed(z: float, pooled: float, fit: float, a: float) -> int | None:
    """Repetitions each run needs for a TARGET_CHANGE to be seen 80 % of the time: the spread
    shrinks as 1/√repetitions, the fits' error does not (None when it alone is too large)."""
    target = TARGET_CHANGE * abs(a) / z
    if not (a and math.isfinite(pooled)) or fit >= target:
        return None
    return max(2, math.ceil(2 * pooled**2 / (target**2 - fit**2)))


def unpaired_spreads(apis_a: dict[str, Any], apis_b: dict[str, Any], domain: str,
                     keep: tuple[list[int], list[int]] | None = None
                     ) -> list[tuple[float, float, int]]:
    """`paired_calls.spreads` over all calls: (calls per repetition, relative variance between
    repetitions' energy per call, its degrees of freedom) of each API of both runs; keep: the
    positions of the compared repetitions of each run (None: all)."""
    values = []
    for name in apis_a.keys() & apis_b.keys():
        for row, kept in zip((apis_a[name], apis_b[name]), keep or (None, None), strict=True):
            reps = per_rep_per_call(row, (row.get("energy") or {}).get(domain) or {}, kept)
            mean = float(reps.mean()) if reps.size > 1 else 0.0
            if mean > 0:
                values.append((_calls_per_rep(row), float(reps.var(ddof=1)) / mean**2,
                               reps.size - 1))
    return values


def _calls_per_rep(row: dict[str, Any]) -> float:
    counts = row.get("per_rep_calls") or []
    return float(np.mean(counts)) if counts else float(row.get("calls") or 0)


@dataclass
class Side:
    """One run as the comparison reads it: its analysis and the positions (in its
    `repetitions`) of the repetitions compared (`compared_repetitions`)."""

    run: RunAnalysis
    keep: list[int]


def _api_row(api: str, sides: tuple[Side, Side], domains: list[dict[str, Any]], tests: int,
             pairs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    ra, rb = (next((r for r in s.run.apis if r["api"] == api), None) for s in sides)
    row: dict[str, Any] = {
        "api": api,
        "written": sorted(set((ra or {}).get("written", [])) | set((rb or {}).get("written", []))),
        "calls_a": (ra or {}).get("calls", 0), "calls_b": (rb or {}).get("calls", 0),
        "time_a_s": (ra or {}).get("mean_time_s"), "time_b_s": (rb or {}).get("mean_time_s"),
        "energy": {},
    }
    for d in domains:
        key = d["domain"]
        ea = ((ra or {}).get("energy") or {}).get(key)
        eb = ((rb or {}).get("energy") or {}).get(key)
        out: dict[str, Any] = {"provenance": d["provenance"]}
        if not d["comparable"] or ea is None or eb is None:
            out["verdict"] = ("only in A" if eb is None and ea is not None else
                              "only in B" if ea is None and eb is not None else
                              d["not_comparable"] if not d["comparable"] else "missing")
            out["per_call"] = {"verdict": out["verdict"]}
            out["per_rep"] = {"verdict": out["verdict"]}
        else:
            out["per_call"] = _per_call(api, (ra or {}, rb or {}), (ea, eb), sides, d, tests,
                                        pairs.get((api, key)))
            na, nb = (len(s.keep) or 1 for s in sides)
            out["per_rep"] = _measure_pair(
                _rep_figures(ea, sides[0].keep), _rep_figures(eb, sides[1].keep),
                "rep_mean_J", "rep_ci95_low", "rep_ci95_high",
                (ea, na, d["spread"]), (eb, nb, d["spread"]), min(na, nb))
            out["verdict"] = out["per_call"]["verdict"]
        row["energy"][key] = out
    return row


def _per_call(api: str, rows: tuple[dict[str, Any], dict[str, Any]],
              energy: tuple[dict[str, Any], dict[str, Any]], sides: tuple[Side, Side],
              d: dict[str, Any], tests: int, paired: dict[str, Any] | None) -> dict[str, Any]:
    """The energy per call of one API in one domain: over the compared repetitions (paired
    calls where the runs share them), else over the calls of one repetition."""
    (ra, rb), (ea, eb) = rows, energy
    ca, cb = ra.get("calls") or 1, rb.get("calls") or 1
    na, nb = len(ea.get("per_rep_J") or []) or 1, len(eb.get("per_rep_J") or []) or 1
    reps_a, reps_b, calls = _series(rows, energy, sides, paired)
    mean_a = float(reps_a.mean()) if reps_a.size else _num(ea["per_call"].get("mean"))
    mean_b = float(reps_b.mean()) if reps_b.size else _num(eb["per_call"].get("mean"))
    if _one_off(ra, rb, calls, d):
        return {"a": mean_a, "b": mean_b, **difference(mean_a, 0.0, mean_b, 0.0),
                "verdict": NOT_IDENTIFIED, "min_detectable_rel": math.nan,
                "reps_for_10pct": None, "pairing": _pairing(paired, ca, cb, na, nb),
                "why": (f"{calls:.4g} call(s) per repetition, each far shorter than the "
                        f"sensor's readings ({units.scaled(d.get('period_s'), 's')}): each "
                        "gets the power of the reading it falls in, which what else ran then "
                        "decides, not the call")}
    if reps_a.size > 1 and reps_b.size > 1:
        fits = (fit_sigma(sides[0].run, d["domain"], api, mean_a),
                fit_sigma(sides[1].run, d["domain"], api, mean_b))
        factor = d.get("factor")
        removed = factor is not None and factor.removed
        shared = _with_between_runs(fits, (mean_a, mean_b), factor.between_runs) \
            if removed else fits  # the APIs' scatter between the runs: every rep of a run's
        tests *= 2 if removed else 1  # judged twice: as measured, and beyond the factor
        out = across_repetitions(mean_a, mean_b, reps_a, reps_b, *shared, tests,
                                 typical_variance(d["spreads"], calls),
                                 shared_dof=factor.between_runs_dof if removed else math.inf)
        if out["verdict"] == NOT_IDENTIFIED:
            out["verdict"], out["why"] = _not_identified(ra, rb, d)
        elif removed:
            out = _beyond_factor(api, out, (reps_a, reps_b), fits, tests, d, calls)
        out["pairing"] = _pairing(paired, ca, cb, na, nb)
        out.setdefault("method", "as measured")
        return out
    # one repetition: calls alone cannot say how much another run would differ
    return _measure_pair(ea["per_call"], eb["per_call"], "mean", "ci95_low", "ci95_high",
                         (ea, ca, d["spread"]), (eb, cb, d["spread"]), min(na, nb))


def _series(rows: tuple[dict[str, Any], dict[str, Any]],
            energy: tuple[dict[str, Any], dict[str, Any]], sides: tuple[Side, Side],
            paired: dict[str, Any] | None) -> tuple[np.ndarray, np.ndarray, float]:
    """Each compared repetition's energy per call of an API in run A and in run B, and its
    calls per repetition: over its calls paired by site and order where the runs share them
    (`analysis.paired_calls`), else over all of them."""
    if paired is not None:
        return paired["reps_a"], paired["reps_b"], float(paired["calls"])
    return (per_rep_per_call(rows[0], energy[0], sides[0].keep),
            per_rep_per_call(rows[1], energy[1], sides[1].keep), _calls_per_rep(rows[0]))


def _repetition_factor(d: dict[str, Any], apis: tuple[dict[str, Any], dict[str, Any]],
                       sides: tuple[Side, Side],
                       pairs: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The domain's repetitions' common factor (`analysis.repetition_factor`, from the APIs
    with MIN_CALLS_RESOLVED calls a repetition or more, costliest first) as d["factor"], and
    the spreads left after it (`paired_calls.spreads`' shape) as d["residual_spreads"], the
    prior of the test beyond it."""
    key, series, eligible = d["domain"], {}, []
    for name in sorted(apis[0].keys() & apis[1].keys()):
        rows = (apis[0][name], apis[1][name])
        energy = tuple((r.get("energy") or {}).get(key) for r in rows)
        if energy[0] is None or energy[1] is None:
            continue
        reps_a, reps_b, calls = _series(rows, energy, sides, pairs.get((name, key)))
        series[name] = (reps_a, reps_b)
        if calls >= MIN_CALLS_RESOLVED:
            eligible.append(name)
    eligible.sort(key=lambda n: -_api_energy(apis[0][n]))
    factor = repetition_factor.estimate(series, eligible)
    d["factor"], d["residual_spreads"] = factor, []
    for name in factor.apis if factor.removed else []:
        share = factor.dof_share[name]
        for left in factor.adjusted(name, series[name]) or ():
            mean = float(left.mean())
            if mean > 0:
                d["residual_spreads"].append((
                    _calls_per_rep(apis[0][name]), float(left.var(ddof=1)) / mean**2 / share,
                    (left.size - 1) * share))


def _with_between_runs(fits: tuple[float, float], means: tuple[float, float],
                       between_runs: float) -> tuple[float, float]:
    """Each run's shared 1σ (`fit_sigma`) with the APIs' own scatter between the runs
    (`RepetitionFactor.between_runs`, half of it each run's) at the run's figure."""
    spread = math.sqrt(between_runs / 2)
    return (math.hypot(fits[0], spread * abs(means[0])),
            math.hypot(fits[1], spread * abs(means[1])))


def _beyond_factor(api: str, raw: dict[str, Any], reps: tuple[np.ndarray, np.ndarray],
                   fits: tuple[float, float], tests: int, d: dict[str, Any], calls: float
                   ) -> dict[str, Any]:
    """The API's own change: its change less the runs' common one, judged against the spread
    left after the repetitions' common factor (`analysis.repetition_factor`) and the APIs'
    scatter between the runs (in `fits`). That is the verdict; a change as measured (`raw`)
    that is beyond its noise but not beyond the common change stands where the common change
    at this API is itself within that noise (the runs did not move together here), and is
    WITH_EVERY_API otherwise: every API moved so, which the program or the machine's speed
    between the runs did (one pair of runs cannot tell which; the domain's row says how
    much). The minimum detectable change and the repetitions for 10 % are this test's: what
    a change of one API has to exceed."""
    factor = d["factor"]
    adjusted = factor.adjusted(api, reps)
    if adjusted is None:
        return {**raw, "method": "as measured (too few calls for the factor)"}
    left_a, left_b = adjusted
    mean_a, mean_b = float(left_a.mean()), float(left_b.mean())
    left = across_repetitions(mean_a, mean_b, left_a, left_b,
                              *_with_between_runs(fits, (mean_a, mean_b), factor.between_runs),
                              tests, typical_variance(d["residual_spreads"], calls),
                              (factor.scale[api], factor.dof_share[api]),
                              factor.between_runs_dof)
    out = {**raw, "method": "beyond the runs' common change",
           "as_measured": {k: raw[k] for k in ("verdict", "noise", "min_detectable_rel",
                                                "reps_for_10pct", "threshold_t")},
           "beyond_common": {k: left[k] for k in ("verdict", "rel", "threshold_t")}}
    noise = left["noise"] * abs(raw["a"] / mean_a) if mean_a else math.nan
    out["beyond_common"]["noise"] = noise
    for k in ("min_detectable", "min_detectable_rel", "reps_for_10pct"):
        out[k] = left[k]
    out["verdict"], out["noise"] = left["verdict"], noise
    if left["verdict"] == "within noise" and raw["verdict"] in ("higher", "lower"):
        common = abs(math.expm1(factor.common[api]) * raw["a"])
        if common > raw["noise"]:  # the common change alone would read as a change
            out["verdict"] = WITH_EVERY_API
        else:  # the runs did not move together here: the change as measured is its own
            out["verdict"], out["noise"] = raw["verdict"], raw["noise"]
    return out


def _one_off(ra: dict[str, Any], rb: dict[str, Any], calls: float,
             d: dict[str, Any]) -> bool:
    """Whether an API's energy per call is below the sensors' resolution in both runs: fewer
    than MIN_CALLS_RESOLVED calls a repetition (set-up calls), each shorter than
    SUB_RESOLUTION of a reading: its figure is one reading's power × its time."""
    period = d.get("period_s") or math.nan
    times = [r.get("mean_time_s") for r in (ra, rb)]
    return calls < MIN_CALLS_RESOLVED and all(
        isinstance(t, (int, float)) and t < SUB_RESOLUTION * period for t in times)


def _not_identified(ra: dict[str, Any], rb: dict[str, Any], d: dict[str, Any]
                    ) -> tuple[str, str]:
    """The verdict and why for an API whose energy per call rests on intensities the fit could
    not identify: below the sensors' resolution when its calls are shorter than a reading."""
    times = [r.get("mean_time_s") for r in (ra, rb)]
    longest = max((t for t in times if isinstance(t, (int, float)) and math.isfinite(t)),
                  default=math.nan)
    period = d.get("period_s") or math.nan
    rest = ("their energy is the power fitted to all such calls together, which each run fits "
            "on its own")
    if longest < period:
        return NOT_IDENTIFIED, (
            f"its calls ({units.scaled(longest, 's')} or less) are shorter than the sensor's "
            f"readings ({units.scaled(period, 's')}) and too few for the intensity fit to "
            f"identify their own power: {rest}")
    return NOT_FITTED, ("the intensity fit could not identify its own power (too few sensor "
                        f"intervals with it, or always in the same mix): {rest}")


def _rep_figures(e: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """The API's energy per repetition over the compared repetitions: mean and 95 % CI."""
    values = np.array([v for i, v in enumerate(e.get("per_rep_J") or [])
                       if i in keep and v is not None and math.isfinite(v)], float)
    if values.size == 0:
        return {"rep_mean_J": math.nan, "rep_ci95_low": None, "rep_ci95_high": None,
                "uncertainty_J": e.get("uncertainty_J")}
    mean, lo, hi = mean_ci95(values)
    return {"rep_mean_J": mean, "rep_ci95_low": lo if math.isfinite(lo) else None,
            "rep_ci95_high": hi if math.isfinite(hi) else None,
            "uncertainty_J": e.get("uncertainty_J")}


def _pairing(paired: dict[str, Any] | None, calls_a: int, calls_b: int, reps_a: int,
             reps_b: int) -> dict[str, Any]:
    """How the calls were compared, for the table's title and the JSON: paired by site and
    call order (how many calls per repetition of each run's, and the paired calls' spread of
    change), or unpaired where the sequences differ."""
    if paired is None:
        return {"paired": False, "text": "unpaired: the two runs' call sequences differ"}
    quartiles = paired["per_call_change"]
    text = (f"paired by site and call order: {paired['calls']} calls per repetition (of "
            f"{calls_a / max(reps_a, 1):.4g} in A, {calls_b / max(reps_b, 1):.4g} in B)")
    if quartiles:
        text += (f"; per paired call, B/A − 1: median {units.percent(quartiles[1])}, "
                 f"quartiles {units.percent(quartiles[0])} to {units.percent(quartiles[2])}")
    return {"paired": True, "calls_per_rep": paired["calls"],
            "per_call_change_quartiles": quartiles, "text": text}


def _measure_pair(
    a: dict[str, Any], b: dict[str, Any], mean: str, low: str, high: str,
    extra_a: tuple[dict[str, Any], int, float], extra_b: tuple[dict[str, Any], int, float],
    reps: int,
) -> dict[str, Any]:
    """One figure of both runs, its noise (95 % half-widths), and whether they differ beyond it.

    extra_*: (the API's energy row, how many calls or repetitions the figure divides by, the
    domain's relative run-to-run spread): the attribution's 1σ per unit and the spread × the
    figure join the CI in quadrature. reps: the fewer repetitions of the two runs (`power`)."""
    va, vb = _num(a.get(mean)), _num(b.get(mean))
    pair = {
        "a": va, "b": vb,
        "a_ci95": _noise(half_width(a.get(low), a.get(high)), va, *extra_a),
        "b_ci95": _noise(half_width(b.get(low), b.get(high)), vb, *extra_b),
    }
    pair.update(difference(pair["a"], pair["a_ci95"], pair["b"], pair["b_ci95"]))
    pair.update(power(pair["noise"], va, reps))
    return pair


def power(noise: float, base: float, reps: int) -> dict[str, Any]:
    """The smallest change the comparison detects 80 % of the time (`min_detectable`, J, and
    relative to A), and the repetitions each run would need to detect a TARGET_CHANGE one: the
    noise shrinks as 1/√repetitions (its CI across repetitions, and the run-to-run spread)."""
    if not (math.isfinite(noise) and math.isfinite(base) and base):
        return {"min_detectable": math.nan, "min_detectable_rel": math.nan,
                "reps_for_10pct": None}
    mdc = noise * (1.96 + POWER_Z) / 1.96
    rel = mdc / abs(base)
    need = math.ceil(max(reps, 2) * (rel / TARGET_CHANGE) ** 2)
    return {"min_detectable": mdc, "min_detectable_rel": rel, "reps_for_10pct": max(need, 2)}


def _noise(ci: float, value: float, energy: dict[str, Any], count: int, spread: float) -> float:
    """A figure's 95 % half-width: its CI (0 when one value), the attribution's uncertainty and
    the run-to-run spread; NaN when the spread is unknown (one repetition in both runs)."""
    if not math.isfinite(spread):
        return math.nan
    attribution = 1.96 * _num(energy.get("uncertainty_J")) / max(count, 1)
    parts = [ci if math.isfinite(ci) else 0.0,
             attribution if math.isfinite(attribution) else 0.0,
             spread * abs(value) if math.isfinite(value) else 0.0]
    return math.sqrt(sum(p * p for p in parts))


def _num(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def compared_repetitions(a: RunAnalysis, b: RunAnalysis) -> tuple[Side, Side, list[str]]:
    """Both runs with the repetitions compared: where some repetitions waited for CPUs
    (`quiet_repetitions`) and each run keeps at least two that did not, those two or more only,
    and a note says which; else all of them."""
    every = [list(range(len(x.repetitions))) for x in (a, b)]
    quiet = [quiet_repetitions((x.load or {}).get("contention") or {}) for x in (a, b)]
    keep = [[i for i, r in enumerate(x.repetitions) if int(r["rep"]) in q]
            for x, q in zip((a, b), quiet, strict=True)]
    if min(len(k) for k in keep) < 2 or keep == every:
        return Side(a, every[0]), Side(b, every[1]), []
    left = [[int(r["rep"]) for i, r in enumerate(x.repetitions) if i not in k]
            for x, k in zip((a, b), keep, strict=True)]
    note = ("Compared over the repetitions load did not distort (waits for a CPU within "
            f"{DISTORTION_LIMIT:.0%} of the CPU time): " + "; ".join(
                f"run {side} left out repetition{'s' if len(out) > 1 else ''} "
                + ", ".join(map(str, out)) for side, out in zip("AB", left, strict=True) if out)
            + " (a loaded repetition stretches every call and its CPU time).")
    return Side(a, keep[0]), Side(b, keep[1]), [note]


def _load_of(side: Side) -> dict[str, Any]:
    """The run's load over the compared repetitions: the program's wait, and other processes'
    CPU use where it was recorded per repetition."""
    load = dict(side.run.load or {})
    reps = [int(side.run.repetitions[i]["rep"]) for i in side.keep]
    if load.get("contention"):
        load["contention"] = over_repetitions(load["contention"], reps)
    other = load.get("program_other_pct_per_rep") or []
    kept = [other[i] for i in side.keep if i < len(other) and math.isfinite(other[i])]
    if len(other) == len(side.run.repetitions) and kept:
        load["program_other_pct"] = float(np.mean(kept))
    return load


def _domains(sa: Side, sb: Side) -> list[dict[str, Any]]:
    a, b = sa.run, sb.run
    da = {d["domain"]: d for d in a.domains}
    db = {d["domain"]: d for d in b.domains}
    out = []
    for key in sorted(da.keys() | db.keys()):
        x, y = da.get(key), db.get(key)
        ok, why = _comparable(x, y)
        loaded = load_differs(_load_of(sa), _load_of(sb)) if key in HOST_DOMAINS else None
        if loaded:  # the difference would be the loads' (`analysis.contention`)
            ok, why = False, loaded + ("" if ok else f"; and {why}")
        ta, tb = (_rep_total(sa, key), _rep_total(sb, key))
        rel = [t[1] / abs(t[0]) for t in (ta, tb)
               if math.isfinite(t[1]) and math.isfinite(t[0]) and t[0]]
        entry = {
            "spread": max(rel) if rel else math.nan,
            "domain": key, "name": domain_name(key), "comparable": ok, "why": why,
            "provenance": (x or y)["provenance"] if ok else "mixed",
            "model": (x or y).get("model") if ok else None,
            "sensor_a": (x or {}).get("sensor"), "sensor_b": (y or {}).get("sensor"),
            "a": ta[0], "a_ci95": ta[1], "b": tb[0], "b_ci95": tb[1],
            "not_comparable": NOT_COMPARABLE_LOAD if loaded else NOT_COMPARABLE,
            "period_s": (x or y).get("period_s"),
        }
        entry.update(difference(ta[0], ta[1], tb[0], tb[1]) if ok else
                     {"diff": math.nan, "rel": math.nan, "noise": math.nan,
                      "verdict": entry["not_comparable"]})
        out.append(entry)
    return out


def _with_every_api(d: dict[str, Any], apis_a: dict[str, Any]) -> None:
    """A domain whose program energy changed by what the runs' common change predicts (each
    API of the factor moved by its common change, weighted by its energy in A) reads
    WITH_EVERY_API, not higher or lower: the whole program moved, which a change to all of it
    or the machine's speed between the runs (measured: identical code 20–45 % cheaper ten
    minutes later on a quiet VM) did alike."""
    factor = d["factor"]
    if not factor.removed or d["verdict"] not in ("higher", "lower"):
        return
    weights = {api: _num(((apis_a[api].get("energy") or {}).get(d["domain"]) or {}).get(
        "above_idle_J")) for api in factor.common if api in apis_a}
    weights = {api: w for api, w in weights.items() if math.isfinite(w)}
    total = sum(weights.values())
    if not total:
        return
    predicted = sum(w * math.expm1(factor.common[api]) for api, w in weights.items()) / total
    if abs(d["rel"] - predicted) * abs(d["a"]) <= d["noise"]:
        d["verdict"] = WITH_EVERY_API
        d["why"] = (f"every API moved together ({predicted:+.0%} predicted by the runs' common "
                    f"change, {d['rel']:+.0%} measured): a change to the whole program, or "
                    "the machine's speed between the runs, which one pair of runs cannot "
                    "tell apart; each API is judged beyond it")


def _rep_total(side: Side, domain: str) -> tuple[float, float]:
    """The run's above-idle energy per repetition: mean and 95 % half-width across the compared
    repetitions."""
    values = np.array([_num(r["energy"].get(domain, {}).get("above_idle_J"))
                       for i, r in enumerate(side.run.per_rep) if i in side.keep])
    if values.size == 0:
        return math.nan, math.nan
    mean, lo, hi = mean_ci95(values)
    return mean, half_width(lo, hi) if math.isfinite(lo) else math.nan


def _run_summary(a: RunAnalysis) -> dict[str, Any]:
    run = a.run
    machine = run.get("machine") or {}
    gpus = ", ".join(g.get("name", "?") for g in machine.get("gpus") or []) or "none"
    return {
        "id": run["id"], "program": run.get("program") or "(unnamed program)",
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(run["created_unix"]))
        if run.get("created_unix") else "–",
        "status": run.get("status"), "level": run.get("level"),
        # from the API rows: a streamed run keeps no call's columns
        "repetitions": len(a.repetitions), "calls": sum(r["calls"] for r in a.apis),
        "machine": f"{machine.get('cpu_model') or 'unknown CPU'}; GPUs: {gpus}",
        "method": a.method,
    }


def columns(domains: list[dict[str, Any]]) -> list[tables.Column]:
    cols = [
        tables.Column("api", "API", "text", ("api",), "api"),
        tables.Column("calls_a", "calls A", "", ("calls_a",), "calls_a"),
        tables.Column("calls_b", "calls B", "", ("calls_b",), "calls_b"),
    ]
    for d in domains:
        k = d["domain"]
        g = tables.Group(d["name"], d["provenance"] if d["comparable"] else None, d.get("model"),
                         None if d["comparable"] else d["why"])
        cols += [
            tables.Column(f"{k}:a", "per call A", "J", ("energy", k, "per_call", "a"),
                          f"{k} per_call_a_J", g),
            tables.Column(f"{k}:b", "per call B", "J", ("energy", k, "per_call", "b"),
                          f"{k} per_call_b_J", g),
            tables.Column(f"{k}:diff", "change", "J", ("energy", k, "per_call", "diff"),
                          f"{k} per_call_diff_J", g, signed=True,
                          title="B − A of the mean energy per call; ± the 95 % noise"),
            tables.Column(f"{k}:rel", "change %", "%", ("energy", k, "per_call", "rel"),
                          f"{k} per_call_rel", g),
            tables.Column(f"{k}:verdict", "per call", "text", ("energy", k, "per_call", "verdict"),
                          f"{k} per_call_verdict", g,
                          title="whether the API's change exceeds the noise of both runs: "
                                "beyond the runs' common change where one was fitted"),
            tables.Column(f"{k}:mdc", "min. detectable", "%",
                          ("energy", k, "per_call", "min_detectable_rel"),
                          f"{k} per_call_min_detectable_rel", g,
                          title="the smallest change of the energy per call these two runs "
                                "detect 80 % of the time (relative to A)"),
            tables.Column(f"{k}:beyond", "beyond common %", "%",
                          ("energy", k, "per_call", "beyond_common", "rel"),
                          f"{k} per_call_beyond_common_rel", g,
                          title="the change less the runs' common change, after the "
                                "repetitions' common factor: what the verdict judges (empty "
                                "where it was not used: the change as measured is judged)"),
            tables.Column(f"{k}:method", "judged", "text",
                          ("energy", k, "per_call", "method"), f"{k} per_call_method", g,
                          shown=False, title="as measured, or beyond the runs' common "
                                             "change (after the repetitions' common factor)"),
            tables.Column(f"{k}:reps10", "reps for 10 %", "",
                          ("energy", k, "per_call", "reps_for_10pct"),
                          f"{k} per_call_reps_for_10pct", g, shown=False,
                          title="repetitions each run would need to detect a 10 % change"),
            tables.Column(f"{k}:rep_diff", "per rep. change", "J",
                          ("energy", k, "per_rep", "diff"), f"{k} per_rep_diff_J", g,
                          signed=True, title="B − A of the API's energy per repetition"),
            tables.Column(f"{k}:rep_verdict", "per rep.", "text",
                          ("energy", k, "per_rep", "verdict"), f"{k} per_rep_verdict", g),
        ]
    # a domain that is not compared shows its verdict alone (its figures are in the chooser)
    return [c if c.group is None or c.group.sensor is None or c.key.endswith(":verdict")
            else dataclasses.replace(c, shown=False) for c in cols]


def _cells(cols: list[tables.Column], row: dict[str, Any]) -> list[tables.Cell]:
    out = []
    for c in cols:
        cell = tables.cell(c, row)
        if c.key.endswith(":diff") or c.key.endswith(":rep_diff"):
            which = "per_call" if c.key.endswith(":diff") else "per_rep"
            noise = tables.lookup(row, ("energy", c.key.split(":")[0], which, "noise"))
            if noise is not None and cell.value is not None:
                cell = tables.Cell(cell.value, cell.text, "± " + units.scaled(noise, "J"),
                                   cell.data)
        elif c.key.endswith(":verdict"):  # how the calls were compared, beside the verdict
            pairing = tables.lookup(row, (*c.path[:-1], "pairing"))
            if pairing:
                shown = (f"paired, {pairing['calls_per_rep']} calls/rep" if pairing["paired"]
                         else "unpaired")
                cell = tables.Cell(cell.value, cell.text, shown, cell.data)
        out.append(cell)
    return out


def csv_text(cols: list[tables.Column], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow([c.csv for c in cols])
    for r in rows:
        values = [tables.lookup(r, c.path) for c in cols]
        writer.writerow(["" if v is None else v for v in values])
    return buf.getvalue()


def compare_runs(a: RunAnalysis, b: RunAnalysis, notes: list[str] | None = None,
                 store: Any = None) -> Comparison:
    """Run A (before) against run B (after), per API and domain; notes: how they were analysed
    (`analyse_pair`); store: where a run analysed streamed (`is_streamed`) has its calls, for
    pairing them (without it, such runs are compared unpaired)."""
    sa, sb, chosen = compared_repetitions(a, b)
    notes = [*(notes or []), *chosen]
    domains = _domains(sa, sb)
    differences = run_differences(a, b)
    apis_a = {r["api"]: r for r in a.apis}
    apis_b = {r["api"]: r for r in b.apis}
    names = sorted(apis_a.keys() | apis_b.keys(),
                   key=lambda n: -max(_api_energy(apis_a.get(n)), _api_energy(apis_b.get(n))))
    tests = _tests(names, (apis_a, apis_b), domains)
    compared = [d["domain"] for d in domains if d["comparable"]]
    reps = ([int(a.repetitions[i]["rep"]) for i in sa.keep],
            [int(b.repetitions[i]["rep"]) for i in sb.keep])
    streamed = is_streamed(a) or is_streamed(b)
    pairs = (pair_streamed(store, a, b, compared, reps) if streamed and store is not None
             else pair_runs(a, b, compared, reps))
    for d in domains:  # each API's prior: the spread of APIs with as many calls (`_per_call`)
        paired = spreads(pairs, d["domain"])
        d["spreads"] = [] if not d["comparable"] else paired if len(paired) >= 3 else \
            unpaired_spreads(apis_a, apis_b, d["domain"], (sa.keep, sb.keep))
        if d["comparable"]:
            _repetition_factor(d, (apis_a, apis_b), (sa, sb), pairs)
            notes.append(repetition_factor.describe(d["factor"], d["domain"]))
    rows = [_api_row(n, (sa, sb), domains, tests, pairs) for n in names]
    for d in domains:
        if "factor" in d:
            _with_every_api(d, apis_a)
            d["repetition_factor"] = repetition_factor.as_json(d.pop("factor"))
    cols = columns(domains)
    groups = tables.groups(cols)
    table = {
        "id": "compare-table", "name": "compare", "columns": cols, "groups": groups,
        "starts": {first for _, _, first in groups if first > 0},
        "rows": [{"cells": _cells(cols, r), "search": " ".join([r["api"], *r["written"]]).lower(),
                  "written": r["written"], "below_res": "", "raised": 0}
                 for r in rows[: tables.HTML_ROW_LIMIT]],
        "total": len(rows), "truncated": len(rows) > tables.HTML_ROW_LIMIT,
    }
    counts: dict[str, int] = {}
    for r in rows:
        for e in r["energy"].values():
            counts[e["verdict"]] = counts.get(e["verdict"], 0) + 1
    runs = {"a": _run_summary(a), "b": _run_summary(b)}
    context = {
        "title": f"run {runs['a']['id']} against run {runs['b']['id']}",
        "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "runs": runs,
        "domains": [{**d, "color": domain_color(d["domain"]),
                     "a_text": _pm(d["a"], d["a_ci95"]), "b_text": _pm(d["b"], d["b_ci95"]),
                     "diff_text": units.scaled(d["diff"], "J", signed=True),
                     "noise_text": units.scaled(d["noise"], "J"),
                     "rel_text": units.percent(d["rel"])} for d in domains],
        "table": table,
        "counts": sorted(counts.items()),
        "differences": differences,
        "notes": list(notes or []),
    }
    charts = {"bars": _bars(rows, domains)}
    data = {"format": 1, "a": runs["a"], "b": runs["b"], "domains": domains, "apis": rows,
            "differences": differences, "notes": list(notes or [])}
    return Comparison(context, charts, data, {"compare": csv_text(cols, rows)})


def _tests(names: list[str], apis: tuple[dict[str, Any], dict[str, Any]],
           domains: list[dict[str, Any]]) -> int:
    """The (API, domain) pairs that can give a verdict, over which the error rate is shared:
    both runs have the API, the domain is compared, and its calls are not below the sensors'
    resolution (`_one_off`: those get no verdict, so they take none of it)."""
    both = [(apis[0][n], apis[1][n]) for n in names if n in apis[0] and n in apis[1]]
    return max(1, sum(1 for d in domains if d["comparable"] for ra, rb in both
                      if not _one_off(ra, rb, _calls_per_rep(ra), d)))


def terminal_lines(comparison: Comparison) -> list[str]:
    """What `report A B` prints: per domain its verdict (and why there is none), how many APIs'
    energy per call read each verdict, then the notes on how the runs were compared."""
    out = []
    for d in comparison.json["domains"]:
        why = "" if d["comparable"] and d["verdict"] != WITH_EVERY_API else f" ({d['why']})"
        out.append(f"{d['domain']}: {d['verdict']}{why}")
        counts: dict[str, int] = {}
        for row in comparison.json["apis"]:
            verdict = row["energy"][d["domain"]]["per_call"]["verdict"]
            counts[verdict] = counts.get(verdict, 0) + 1
        if d["comparable"]:
            ranked = sorted(counts.items(), key=lambda kv: -kv[1])
            out.append("  energy per call: " + ", ".join(f"{n} {v}" for v, n in ranked))
            out += _changed_lines(comparison.json["apis"], d["domain"])
    return out + comparison.json["notes"]


def _changed_lines(rows: list[dict[str, Any]], domain: str) -> list[str]:
    """The APIs a domain's verdicts name (higher or lower), costliest first, TOP_CHANGED at
    most: each with its change and the noise it exceeded (beyond the runs' common change where
    that was judged), so that the terminal says which APIs changed, not only how many."""
    changed = [(row["api"], row["energy"][domain]["per_call"]) for row in rows
               if row["energy"][domain]["per_call"]["verdict"] in ("higher", "lower")]
    lines = []
    for api, figure in changed[:TOP_CHANGED]:
        beyond = figure.get("beyond_common") or {}
        judged = beyond if beyond.get("verdict") == figure["verdict"] else figure
        noise = judged["noise"] / abs(figure["a"]) if figure.get("a") else math.nan
        lines.append(f"    {figure['verdict']}: {api} {judged['rel'] * 100:+.1f} %"
                     f"{' beyond the common change' if judged is beyond else ''} (noise "
                     f"±{units.percent(noise)}; detectable from "
                     f"{units.percent(figure.get('min_detectable_rel'))})")
    if len(changed) > TOP_CHANGED:
        lines.append(f"    … and {len(changed) - TOP_CHANGED} more (compare.csv has them all)")
    return lines


def _api_energy(row: dict[str, Any] | None) -> float:
    if not row:
        return 0.0
    return sum(_num(e.get("above_idle_J")) for e in row["energy"].values()
               if math.isfinite(_num(e.get("above_idle_J"))))


def _pm(value: float, half: float) -> str:
    text = units.with_noise(value, half / 2 if math.isfinite(half) else None, short=True)
    return text + (f" ± {units.scaled(half, 'J')}" if math.isfinite(half) else "")


def _bars(rows: list[dict[str, Any]], domains: list[dict[str, Any]]) -> dict[str, Any]:
    series, items = [], []
    for d in domains:
        if not d["comparable"]:
            continue
        base = domain_color(d["domain"])
        for k, side in enumerate(("a", "b")):
            series.append({"key": f"{d['domain']}:{side}", "color": shade(base, k, 2),
                           "label": f"{d['name']} ({d['provenance']}), run "
                                    f"{'A' if side == 'a' else 'B'}"})
    for r in rows[:TOP_BARS]:
        values = {}
        for d in domains:
            e = r["energy"][d["domain"]].get("per_call", {})
            for side in ("a", "b"):
                v = e.get(side)
                if v is not None and math.isfinite(v):
                    values[f"{d['domain']}:{side}"] = v
        if values:
            items.append({"label": r["api"], "values": values})
    return {"type": "bars", "mode": "grouped", "unit": "J", "series": series, "items": items,
            "totals": False, "empty": "no API with energy in both runs"}
