"""A baseline's tests against this session's, with the rules of `fecomlite report A B`
(`fecomlite.report.compare.difference`): a verdict only when the difference exceeds the noise
of both measurements (√(hA² + hB²), each h the 95 % half-width across the test's repetitions);
no verdict, with the reason, when a domain was measured in one and estimated in the other (or
by other models), when other processes kept the CPUs busy, when the test was shorter than the
sensor's update period, or when one repetition leaves the noise unknown.

Memory verdicts are apart from energy ones: a test's peak host memory (the kernel's high-water
mark above its level at the start) is close to deterministic, so with one repetition its noise is
the resolution floor MEMORY_FLOOR_B (RSS moves in pages, and the allocator keeps or returns
freed blocks depending on what ran before), and it can gate where energy cannot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fecomlite.analysis.run_analysis import domain_role, mean_ci95, reliable_when
from fecomlite.report.compare import difference, half_width

MEMORY_FLOOR_B = 1 << 20
MEMORY_FIGURES = (("host_peak_B", "host memory peak"), ("gpu_peak_B", "GPU memory peak"))
EXPLAINED_BY = 3  # APIs named per verdict


def _values(values: list[Any]) -> np.ndarray:
    return np.array([v for v in values if isinstance(v, (int, float)) and math.isfinite(v)],
                    dtype=float)


def _mean_half(values: list[Any], floor: float) -> tuple[float, float]:
    mean, lo, hi = mean_ci95(_values(values))
    half = half_width(lo, hi) if math.isfinite(lo) else math.nan
    if floor:
        half = max(half, floor) if math.isfinite(half) else floor
    return mean, half


def figure(values_a: list[Any], values_b: list[Any], floor: float = 0.0) -> dict[str, Any]:
    """One figure of both sides: means, noise, difference and verdict (`difference`)."""
    (a, ha), (b, hb) = _mean_half(values_a, floor), _mean_half(values_b, floor)
    out = {"a": a, "b": b, "a_ci95": ha, "b_ci95": hb}
    out.update(difference(a, ha, b, hb))
    if out["verdict"] == "too few values":
        out["why"] = ("one repetition: the run-to-run noise is unknown "
                      "(--fecomlite-repeat 3 gives energy verdicts)")
    return out


def _no_verdict(why: str) -> dict[str, Any]:
    return {"verdict": "no verdict", "why": why}


def energy_domain(domain: str, ra: dict[str, Any], rb: dict[str, Any]) -> dict[str, Any]:
    """One domain's energy per repetition (idle included) of a test in both sessions."""
    sa, sb = ra["sensors"].get(domain), rb["sensors"].get(domain)
    if sa is None or sb is None:
        return _no_verdict(f"only {'in the baseline' if sb is None else 'now'}")
    if sa["provenance"] != sb["provenance"]:
        return _no_verdict(f"{sa['provenance']} in the baseline, {sb['provenance']} now")
    if (sa.get("model") or "") != (sb.get("model") or ""):
        return _no_verdict(f"models differ: {sa.get('model')} / {sb.get('model')}")
    for side, row in (("baseline", ra), ("now", rb)):
        if not reliable_when(domain, bool(row.get("busy"))):
            return _no_verdict(f"busy machine ({side}): other processes used "
                               f"{row.get('other_cpu_pct') or 0:.0f} % of the CPUs")
        if domain in row.get("below_resolution", []):
            return _no_verdict(f"shorter than the sensor's update period "
                               f"({row['sensors'][domain]['resolution_s']:g} s) ({side})")
    out = figure(ra["energy_J"][domain], rb["energy_J"][domain])
    out["provenance"] = sa["provenance"]
    return out


def explain(ra: dict[str, Any], rb: dict[str, Any], key: Any) -> list[dict[str, Any]]:
    """The APIs whose figure `key(api_row)` changed most between the sessions."""
    a = {x["api"]: x for x in ra.get("apis", [])}
    b = {x["api"]: x for x in rb.get("apis", [])}
    changes = []
    for api in a.keys() | b.keys():
        va, vb = (key(x[api]) if api in x else 0.0 for x in (a, b))
        if va is None or vb is None or vb == va:
            continue
        changes.append({"api": api, "a": va, "b": vb, "diff": vb - va})
    changes.sort(key=lambda c: -abs(c["diff"]))
    return changes[:EXPLAINED_BY]


def _memory_of(api: dict[str, Any]) -> float | None:
    """An API's memory in a test: the bytes its results held where the probe sized them (exact),
    else what its calls added to RSS."""
    return api["result_B"] if api.get("result_B") is not None else api.get("memory_added_B")


def _lead(energy: dict[str, dict[str, Any]]) -> str | None:
    """The domain a test's energy verdict is told by: the first disjoint one with a verdict."""
    ranked = sorted(energy, key=lambda d: (domain_role(d)["role"] != "disjoint",
                                           energy[d]["verdict"] not in ("higher", "lower"), d))
    return ranked[0] if ranked else None


def compare_test(ra: dict[str, Any], rb: dict[str, Any]) -> dict[str, Any]:
    """Memory and energy verdicts of one test, and the APIs that account for each."""
    memory = {}
    for key, label in MEMORY_FIGURES:
        va, vb = ra["memory"].get(key) or [], rb["memory"].get(key) or []
        if any(v is not None for v in va) and any(v is not None for v in vb):
            memory[key] = {"label": label, **figure(va, vb, MEMORY_FLOOR_B)}
    domains = sorted(ra["sensors"].keys() | rb["sensors"].keys())
    energy = {d: energy_domain(d, ra, rb) for d in domains}
    lead = _lead(energy)
    return {
        "nodeid": rb["nodeid"],
        "memory": memory,
        "energy": energy,
        "energy_lead": lead,
        "memory_apis": explain(ra, rb, _memory_of),
        "energy_apis": explain(ra, rb, lambda x: (x.get("energy_J") or {}).get(lead)
                               if lead else x.get("time_s")),
    }


def gate(tests: list[dict[str, Any]], fail: dict[str, float]) -> list[str]:
    """The gate's failures: a verdict "higher" by more than the kind's threshold."""
    failures = []
    for t in tests:
        checks = []
        if "memory" in fail:
            checks += [("memory", v["label"], v) for v in t.get("memory", {}).values()]
        if "energy" in fail:
            checks += [("energy", d, v) for d, v in t.get("energy", {}).items()]
        for kind, what, v in checks:
            if v.get("verdict") == "higher" and v["rel"] > fail[kind]:
                failures.append(f"{t['nodeid']}: {what} +{100 * v['rel']:.1f} % "
                                f"(gate {kind}:{100 * fail[kind]:g}%)")
    return failures


def compare(baseline: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]],
            fail: dict[str, float]) -> dict[str, Any]:
    """Every test of either session: its verdicts, or that it is new or gone; the gate."""
    tests = [compare_test(baseline[n], now[n]) for n in sorted(baseline.keys() & now.keys())]
    return {
        "tests": tests,
        "new": sorted(now.keys() - baseline.keys()),
        "gone": sorted(baseline.keys() - now.keys()),
        "failures": gate(tests, fail),
        "fail": fail,
    }
