"""Data-size experiments: how each API's energy, time and memory scale with the data size.

The probe cuts the target call's tensor arguments to a fraction of their first dimension at run
time (no code edits); each fraction is its own child run. The target's figures are fitted against
its input bytes; and every API whose calls or inputs change with the fraction (a DataLoader over
a cut dataset runs fewer `step`s) is fitted against the fraction: its call count, time, energy in
the run's headline domain and the memory its calls add, each as a power law in log-log with the
exponent's standard error and 95 % interval from the scatter of the points.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from fecomlite.analysis.pieces import call_count

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# per-API figures fitted against the fraction: (key, unit, label)
API_METRICS = (
    ("calls", "", "calls"),
    ("seconds", "s", "time"),
    ("energy_J", "J", "energy"),
    ("mem_added_B", "B", "memory added"),
)
TARGET_METRICS = ("seconds", "energy_J", "mem_added_B")


def parse_fractions(text: str) -> list[float]:
    """'0.1,0.5,1' -> [0.1, 0.5, 1.0]; each in (0, 1]."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"fractions must be numbers separated by commas: {text!r}") from exc
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"fractions must lie in (0, 1]: {text!r}")
    return sorted(set(values))


# -- fits -------------------------------------------------------------------------------------


def _r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else 1.0


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float, float | None, float | None]:
    """Least squares y = a + b·x: (a, b, standard error of b, its 95 % half-width); the error
    needs a third point (it is the residuals' scatter)."""
    b, a = np.polyfit(x, y, 1)
    n = x.size
    if n < 3:
        return float(a), float(b), None, None
    from scipy.stats import t as student_t

    residual = float(np.sum((y - a - b * x) ** 2)) / (n - 2)
    se = math.sqrt(residual / float(np.sum((x - x.mean()) ** 2)))
    return float(a), float(b), se, se * float(student_t.ppf(0.975, n - 2))


def fit_curves(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """y = a + b·x and y = c·x^k (a line in log-log, on the positive points; `dropped` counts
    the others), each with R² on y and its slope's standard error and 95 % interval."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    fits: dict[str, Any] = {"points": int(x.size)}
    if x.size < 2 or np.ptp(x) == 0:
        return fits
    a, b, se, half = _line(x, y)
    fits["linear"] = {
        "intercept": a,
        "slope": b,
        "slope_se": se,
        "slope_ci95": None if half is None else [b - half, b + half],
        "r2": _r_squared(y, a + b * x),
    }
    positive = (x > 0) & (y > 0)
    if positive.sum() >= 2 and np.ptp(x[positive]) > 0:
        log_c, k, se, half = _line(np.log(x[positive]), np.log(y[positive]))
        c = math.exp(log_c)
        fits["power"] = {
            "coefficient": c,
            "exponent": k,
            "exponent_se": se,
            "exponent_ci95": None if half is None else [k - half, k + half],
            "r2": _r_squared(y, c * x**k),
            "dropped": int(x.size - positive.sum()),
        }
    return fits


# -- points from the child runs -----------------------------------------------------------------


def child_points(
    store: Any, run_id: int, target: str, fraction: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One child run's points: the target's (one per repetition: its input bytes, time, energy
    per domain, memory added during its calls) and every API's (one per API and repetition).
    Each names the run's lead domain; `summarise` fits the energy of one domain for all."""
    from fecomlite.analysis.run_analysis import analyse_run, lead_domain

    analysis = analyse_run(store, run_id, compare_levels=False)
    calls = analysis.calls
    lead = lead_domain(analysis.domains)  # the domain the API table is ranked by
    provenance = {d["domain"]: d["provenance"] for d in analysis.domains}
    added = _added(calls["rss_start_B"], calls["rss_peak_B"])
    gpu_added = _added(calls["gpu_mem_start_B"], calls["gpu_mem_peak_B"])

    def sized(mask: np.ndarray) -> np.ndarray:
        values = calls["in_bytes"][mask]
        return values[values >= 0]

    def figures(mask: np.ndarray) -> dict[str, Any]:
        inputs = sized(mask)
        return {
            "fraction": fraction,
            "run_id": run_id,
            "calls": call_count(calls["status"][mask]),
            "in_bytes": float(inputs.mean()) if inputs.size else math.nan,  # per sized call
            "seconds": float(calls["duration_s"][mask].sum()),
            "energy_by_domain": {d: float(e[mask].sum()) for d, e in calls["energy_J"].items()},
            "provenance_by_domain": provenance,
            "lead_domain": lead["domain"] if lead else None,
            "mem_added_B": _nanmax(added[mask]),
            "gpu_mem_added_B": _nanmax(gpu_added[mask]),
        }

    api_of = {row["key"]: row["api"] for row in analysis.sites}
    targets = [i for i, key in enumerate(analysis.site_keys) if target in (key, api_of.get(key))]
    on_target = np.isin(calls["site"], targets)
    target_points, api_points = [], []
    for rep in sorted(set(calls["rep"].tolist())):
        in_rep = calls["rep"] == rep
        mask = on_target & in_rep
        if mask.any():
            inputs = sized(mask)
            largest = float(inputs.max()) if inputs.size else math.nan
            target_points.append({**figures(mask), "rep": rep, "input_bytes": largest})
        for i in sorted(set(calls["api"][in_rep].tolist())):
            api_points.append(
                {**figures(in_rep & (calls["api"] == i)), "rep": rep, "api": analysis.api_names[i]}
            )
    return target_points, api_points


def energy_domain(points: list[dict[str, Any]]) -> str | None:
    """The domain whose energy is fitted: the lead domain of most child runs (a busy machine can
    change one run's lead) among those every point has."""
    common = (
        set.intersection(*(set(p.get("energy_by_domain", {})) for p in points)) if points else set()
    )
    leads = Counter(p.get("lead_domain") for p in points if p.get("lead_domain") in common)
    return leads.most_common(1)[0][0] if leads else (min(common) if common else None)


def with_energy(points: list[dict[str, Any]], domain: str | None) -> list[dict[str, Any]]:
    """Each point with `energy_J` (in `domain`, None without one), `domain` and `provenance`."""
    return [
        {
            **p,
            "energy_J": p["energy_by_domain"][domain] if domain else None,
            "domain": domain,
            "provenance": p["provenance_by_domain"].get(domain) if domain else None,
        }
        for p in points
    ]


def _added(start: np.ndarray, peak: np.ndarray) -> np.ndarray:
    """How far above its starting level memory went during each call (0 when it did not)."""
    return np.maximum(peak - start, 0.0)


def _nanmax(values: np.ndarray) -> float | None:
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else None


# -- the experiment's result ----------------------------------------------------------------------


def summarise(
    points: list[dict[str, Any]], api_points: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The target's fits against its input bytes, and `apis`: each API's fits against the
    fraction (`api_scaling`); energy in one domain for all (`energy_domain`), named with its
    provenance."""
    domain = energy_domain([*points, *(api_points or [])])
    points = with_energy(points, domain)
    api_points = with_energy(api_points or [], domain)
    x = np.array([p["input_bytes"] for p in points], float)
    return {
        "points": points,
        "domain": domain,
        "provenance": next((p["provenance"] for p in [*points, *api_points]), None),
        "fits": {
            metric: fit_curves(x, np.array([p[metric] for p in points], float))
            for metric in TARGET_METRICS
            if points and all(p.get(metric) is not None for p in points)
        },
        "apis": api_scaling(api_points),
    }


def api_scaling(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per API: whether its calls or inputs change with the fraction (`changes`), its
    points, and a fit against the fraction of every figure in API_METRICS. Rows that change come
    first, by their time exponent, largest first."""
    by_api: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in points:
        by_api[p["api"]].append(p)
    rows = []
    for api, pts in by_api.items():
        x = np.array([p["fraction"] for p in pts], float)
        fits = {}
        for metric, _, _ in API_METRICS:
            y = np.array([np.nan if p.get(metric) is None else p[metric] for p in pts], float)
            if np.isfinite(y).sum() >= 2:
                fits[metric] = fit_curves(x, y)
        rows.append(
            {
                "api": api,
                "changes": _changes(pts),
                "fractions": sorted({p["fraction"] for p in pts}),
                "points": pts,
                "fits": fits,
            }
        )
    rows.sort(key=lambda r: (not r["changes"], -_exponent(r, "seconds", math.inf)))
    return rows


def _changes(points: list[dict[str, Any]]) -> bool:
    """Whether the mean call count per repetition or the mean input bytes per call differ
    between fractions."""
    calls: dict[float, list[float]] = defaultdict(list)
    inputs: dict[float, list[float]] = defaultdict(list)
    for p in points:
        calls[p["fraction"]].append(p["calls"])
        if math.isfinite(p["in_bytes"]):
            inputs[p["fraction"]].append(p["in_bytes"])

    def varies(groups: dict[float, list[float]]) -> bool:
        return len({float(np.mean(v)) for v in groups.values()}) > 1

    return varies(calls) or varies(inputs)


def _exponent(row: dict[str, Any], metric: str, missing: float) -> float:
    power = (row["fits"].get(metric) or {}).get("power")
    return missing if power is None else float(power["exponent"])


def exponent_text(row: dict[str, Any], metric: str) -> str:
    """'0.98 ± 0.05' (the 95 % half-width), '0.98' without one, '–' without a fit."""
    power = (row["fits"].get(metric) or {}).get("power")
    if power is None:
        return "–"
    ci = power.get("exponent_ci95")
    text = f"{power['exponent']:.2f}"
    return text if ci is None else f"{text} ± {(ci[1] - ci[0]) / 2:.2f}"


def program_fit_lines(result: dict[str, Any]) -> list[str]:
    """The whole program's fits against its input bytes, one line per figure: the linear fit
    with its fixed cost beside the power law (an exponent below 1 with a large fixed cost is a
    line that does not pass through zero, not a sub-linear cost)."""
    from fecomlite.analysis.units import scaled

    labels = {"seconds": ("time", "s"), "energy_J": ("energy", "J"),
              "mem_added_B": ("memory added", "B")}
    lines = []
    for metric, fit in (result.get("fits") or {}).items():
        name, unit = labels.get(metric, (metric, ""))
        parts = []
        if fit.get("linear"):
            f = fit["linear"]
            parts.append(f"{scaled(f['intercept'], unit)} fixed + {scaled(f['slope'], unit)} "
                         f"per byte (linear, R² {f['r2']:.3f})")
        if fit.get("power"):
            f = fit["power"]
            parts.append(f"∝ bytes^{f['exponent']:.2f} (power law, R² {f['r2']:.3f})")
        if parts:
            lines.append(f"{name}: " + "; ".join(parts))
    return lines


def largest_exponents(result: dict[str, Any], top: int = 8) -> list[dict[str, Any]]:
    """The APIs that change with the fraction, with the largest exponent of any figure first."""
    rows = [r for r in result.get("apis", []) if r["changes"]]

    def largest(row: dict[str, Any]) -> float:
        values = [_exponent(row, m, -math.inf) for m, _, _ in API_METRICS]
        return max(values)

    return sorted(rows, key=largest, reverse=True)[:top]
