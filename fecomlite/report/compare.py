"""Two runs side by side (before and after a change): per API and energy domain, the difference
and whether it is larger than the noise.

Noise is read from the runs' own 95 % confidence intervals: for independent estimates the
half-width of the difference's interval is √(hA² + hB²), so a change counts as real when
|B − A| exceeds it. Two figures are compared: the mean energy per call (the cost of one call)
and the API's energy per repetition (its cost in the program, call counts included). A domain
measured in one run and estimated in the other, or estimated by different models, is not
compared: the difference would be the sensors', not the program's. Nor is a domain attributed by
different methods (`analyse_pair` attributes both runs again by overlap when `auto` chose
differently), nor a machine-level domain on a machine other processes kept busy.

Energy per call, with two repetitions or more in both runs: compared over the repetitions'
energy per call, of the calls paired by site and call order where the runs share them (the k-th
call of a site in A against its k-th in B, `analysis.paired_calls`; unpaired where the call
sequences differ) (`across_repetitions`: Student's t, each API's spread moderated by the domain's
typical one (`typical_spread`), family-wise 5 % over the page's APIs and domains, the minimum
detectable change and the repetitions a 10 % change needs beside it).
Host domains of runs whose load differed (`analysis.contention.load_differs`) are "not
comparable: load", with the reason. Otherwise (and for the energy per repetition):

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

from fecomlite.analysis import units
from fecomlite.analysis.contention import load_differs
from fecomlite.analysis.distributions import t_quantile
from fecomlite.analysis.paired_calls import pair_runs
from fecomlite.analysis.paired_calls import typical_spread as paired_spread
from fecomlite.analysis.run_analysis import HOST_DOMAINS, RunAnalysis, analyse_run, mean_ci95
from fecomlite.report import tables
from fecomlite.report.palette import domain_color, domain_name, shade

TOP_BARS = 15
NOT_COMPARABLE = "not comparable"
NOT_COMPARABLE_LOAD = "not comparable: load"
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
    """Both runs analysed alike: when `auto` chose a different method for a domain in each,
    both are attributed again by overlap (the method both can use), and a note says why."""
    a, b = analyse_run(store, run_a, method), analyse_run(store, run_b, method)
    ma = {d["domain"]: d["method"] for d in a.domains}
    mb = {d["domain"]: d["method"] for d in b.domains}
    differ = sorted(k for k in ma.keys() & mb.keys() if ma[k] != mb[k])
    if method != "auto" or not differ:
        return a, b, []
    note = ("Both runs were attributed again by overlap: the automatic choice differed ("
            + "; ".join(f"{k}: {ma[k]} in A, {mb[k]} in B" for k in differ)
            + "), and figures attributed differently would differ by method, not by program.")
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


def per_rep_per_call(row: dict[str, Any], energy: dict[str, Any]) -> np.ndarray:
    """Each repetition's energy per call of the API (the raw estimates: noise keeps its sign):
    a deterministic program makes the same calls in every repetition, so these differ only by
    what differs between repetitions, not by how the API's calls differ from one another."""
    values = energy.get("raw_per_rep_J") or energy.get("per_rep_J") or []
    counts = row.get("per_rep_calls") or []
    return np.array([v / c for v, c in zip(values, counts, strict=False)
                     if c and v is not None and math.isfinite(v)], float)


def across_repetitions(
    a: float, b: float, reps_a: np.ndarray, reps_b: np.ndarray,
    extra_a: tuple[dict[str, Any], int], extra_b: tuple[dict[str, Any], int], tests: int,
    prior: float = math.nan,
) -> dict[str, Any]:
    """The energy per call of both runs compared over their repetitions (Student's two-sample
    t on the repetitions' per-call means, pooled variance), family-wise at 5 % over the
    comparison's `tests` (API, domain) pairs (Bonferroni), so that identical code gives no
    verdict; the attribution's own uncertainty per call joins in quadrature. With it, the
    smallest change detected 80 % of the time and the repetitions a 10 % change needs. prior:
    the domain's typical relative variance between repetitions (`typical_spread`), which
    moderates this API's own (a moderated t: three repetitions alone say little about a
    spread)."""
    dof = reps_a.size + reps_b.size - 2
    variance = ((reps_a.size - 1) * reps_a.var(ddof=1)
                + (reps_b.size - 1) * reps_b.var(ddof=1)) / dof
    if math.isfinite(prior) and a:  # moderated: the domain's typical spread as PRIOR_DOF more
        variance = (PRIOR_DOF * prior * a * a + dof * variance) / (PRIOR_DOF + dof)
        dof += PRIOR_DOF
    pooled = math.sqrt(variance)
    crit = t_quantile(1 - FAMILY_ALPHA / (2 * max(tests, 1)), dof)
    attribution = [1.96 * _num(e.get("uncertainty_J")) / max(n, 1) for e, n in (extra_a, extra_b)]
    spread = crit * pooled * math.sqrt(1 / reps_a.size + 1 / reps_b.size)
    noise = math.sqrt(spread**2 + sum(x * x for x in attribution if math.isfinite(x)))
    out = {"a": a, "b": b, "a_ci95": math.nan, "b_ci95": math.nan, "repetitions_compared":
           [int(reps_a.size), int(reps_b.size)], "threshold_t": crit}
    out.update(difference(a, 0.0, b, 0.0))
    out["noise"] = noise
    if math.isfinite(out["diff"]):
        out["verdict"] = ("higher" if out["diff"] > 0 else "lower") if abs(
            out["diff"]) > noise else "within noise"
    mdc = noise * (crit + t_quantile(0.8, dof)) / crit
    out["min_detectable"] = mdc
    out["min_detectable_rel"] = mdc / abs(a) if math.isfinite(a) and a else math.nan
    # with many repetitions t tends to the normal: the thresholds those repetitions would use
    z = NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * max(tests, 1))) + NormalDist().inv_cdf(0.8)
    need = z * pooled / (TARGET_CHANGE * abs(a)) if a else math.nan
    out["reps_for_10pct"] = max(2, math.ceil(2 * need**2)) if math.isfinite(need) else None
    return out


def typical_spread(apis_a: dict[str, Any], apis_b: dict[str, Any], domain: str) -> float:
    """The median over the APIs of both runs of their relative variance between repetitions'
    energy per call (NaN with fewer than three APIs of two repetitions or more)."""
    values = []
    for name in apis_a.keys() & apis_b.keys():
        for row in (apis_a[name], apis_b[name]):
            reps = per_rep_per_call(row, (row.get("energy") or {}).get(domain) or {})
            mean = float(reps.mean()) if reps.size > 1 else 0.0
            if mean > 0:
                values.append(float(reps.var(ddof=1)) / mean**2)
    return float(np.median(values)) if len(values) >= 3 else math.nan


def _api_row(api: str, ra: dict[str, Any] | None, rb: dict[str, Any] | None,
             domains: list[dict[str, Any]], tests: int,
             pairs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
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
            ca, cb = (ra or {}).get("calls") or 1, (rb or {}).get("calls") or 1
            na, nb = len(ea.get("per_rep_J") or []) or 1, len(eb.get("per_rep_J") or []) or 1
            paired = pairs.get((api, key))
            if paired is not None:  # the same calls in both runs (`analysis.paired_calls`)
                reps_a, reps_b = paired["reps_a"], paired["reps_b"]
                mean_a, mean_b = float(reps_a.mean()), float(reps_b.mean())
            else:
                reps_a, reps_b = per_rep_per_call(ra or {}, ea), per_rep_per_call(rb or {}, eb)
                mean_a = _num(ea["per_call"].get("mean"))
                mean_b = _num(eb["per_call"].get("mean"))
            if reps_a.size > 1 and reps_b.size > 1:
                out["per_call"] = across_repetitions(
                    mean_a, mean_b, reps_a, reps_b, (ea, ca), (eb, cb), tests,
                    d.get("prior", math.nan))
                out["per_call"]["pairing"] = _pairing(paired, ca, cb, na, nb)
            else:  # one repetition: calls alone cannot say how much another run would differ
                out["per_call"] = _measure_pair(ea["per_call"], eb["per_call"],
                                                "mean", "ci95_low", "ci95_high",
                                                (ea, ca, d["spread"]), (eb, cb, d["spread"]),
                                                min(na, nb))
            out["per_rep"] = _measure_pair(ea, eb, "rep_mean_J", "rep_ci95_low", "rep_ci95_high",
                                           (ea, na, d["spread"]), (eb, nb, d["spread"]),
                                           min(na, nb))
            out["verdict"] = out["per_call"]["verdict"]
        row["energy"][key] = out
    return row


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


def _domains(a: RunAnalysis, b: RunAnalysis) -> list[dict[str, Any]]:
    da = {d["domain"]: d for d in a.domains}
    db = {d["domain"]: d for d in b.domains}
    out = []
    for key in sorted(da.keys() | db.keys()):
        x, y = da.get(key), db.get(key)
        ok, why = _comparable(x, y)
        loaded = load_differs(a.load or {}, b.load or {}) if key in HOST_DOMAINS else None
        if loaded:  # the difference would be the loads' (`analysis.contention`)
            ok, why = False, loaded + ("" if ok else f"; and {why}")
        ta, tb = (_rep_total(a, key), _rep_total(b, key))
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
        }
        entry.update(difference(ta[0], ta[1], tb[0], tb[1]) if ok else
                     {"diff": math.nan, "rel": math.nan, "noise": math.nan,
                      "verdict": entry["not_comparable"]})
        out.append(entry)
    return out


def _rep_total(a: RunAnalysis, domain: str) -> tuple[float, float]:
    """The run's above-idle energy per repetition: mean and 95 % half-width across reps."""
    values = np.array([_num(r["energy"].get(domain, {}).get("above_idle_J")) for r in a.per_rep])
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
                          title="whether the change exceeds the noise of both runs' CIs"),
            tables.Column(f"{k}:mdc", "min. detectable", "%",
                          ("energy", k, "per_call", "min_detectable_rel"),
                          f"{k} per_call_min_detectable_rel", g,
                          title="the smallest change of the energy per call these two runs "
                                "detect 80 % of the time (relative to A)"),
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


def compare_runs(a: RunAnalysis, b: RunAnalysis, notes: list[str] | None = None) -> Comparison:
    """Run A (before) against run B (after), per API and domain; notes: how they were analysed
    (`analyse_pair`)."""
    domains = _domains(a, b)
    differences = run_differences(a, b)
    apis_a = {r["api"]: r for r in a.apis}
    apis_b = {r["api"]: r for r in b.apis}
    names = sorted(apis_a.keys() | apis_b.keys(),
                   key=lambda n: -max(_api_energy(apis_a.get(n)), _api_energy(apis_b.get(n))))
    tests = len(names) * sum(1 for d in domains if d["comparable"])
    pairs = pair_runs(a, b, [d["domain"] for d in domains if d["comparable"]])
    for d in domains:
        prior = paired_spread(pairs, d["domain"])
        d["prior"] = (math.nan if not d["comparable"] else prior if math.isfinite(prior)
                      else typical_spread(apis_a, apis_b, d["domain"]))
    rows = [_api_row(n, apis_a.get(n), apis_b.get(n), domains, tests, pairs) for n in names]
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
