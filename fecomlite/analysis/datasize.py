"""Data-size experiments: how a call's energy, time and memory scale with its input size.

The probe cuts the target call's tensor arguments to a fraction of their first dimension at run
time (no code edits); each fraction is its own child run. Here the children's figures for the
target are fitted with a linear and a power-law curve, each with its goodness of fit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


def parse_fractions(text: str) -> list[float]:
    """'0.1,0.5,1' -> [0.1, 0.5, 1.0]; each in (0, 1]."""
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise ValueError(f"fractions must be numbers separated by commas: {text!r}") from exc
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"fractions must lie in (0, 1]: {text!r}")
    return sorted(set(values))


def _r_squared(y: np.ndarray, predicted: np.ndarray) -> float:
    total = float(np.sum((y - y.mean()) ** 2))
    return 1.0 - float(np.sum((y - predicted) ** 2)) / total if total > 0 else 1.0


def fit_curves(x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Least-squares fits y = a + b·x and y = c·x^k (in log space), with R² on y."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    fits: dict[str, Any] = {"points": len(x)}
    if len(x) < 2 or np.ptp(x) == 0:
        return fits
    b, a = np.polyfit(x, y, 1)
    fits["linear"] = {"intercept": a, "slope": b, "r2": _r_squared(y, a + b * x)}
    positive = (x > 0) & (y > 0)
    if positive.sum() >= 2 and np.ptp(x[positive]) > 0:
        k, log_c = np.polyfit(np.log(x[positive]), np.log(y[positive]), 1)
        c = float(np.exp(log_c))
        fits["power"] = {"coefficient": c, "exponent": k, "r2": _r_squared(y, c * x**k)}
    return {key: _floats(value) for key, value in fits.items()}


def _floats(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _floats(v) for k, v in value.items()}
    return float(value) if isinstance(value, (np.floating, float)) else value


def summarise(points: list[dict[str, Any]]) -> dict[str, Any]:
    """points: one per (fraction, repetition) with input_bytes, seconds, energy_J, peak_rss_B."""
    x = np.array([p["input_bytes"] for p in points], float)
    return {
        "points": points,
        "fits": {
            metric: fit_curves(x, np.array([p[metric] for p in points], float))
            for metric in ("seconds", "energy_J", "peak_rss_B")
            if all(p.get(metric) is not None for p in points)
        },
    }


def datasize_point(store: Any, run_id: int, target: str, fraction: float) -> list[dict[str, Any]]:
    """One point per repetition of a child run: the target's input bytes, time, energy, peak RSS."""
    from fecomlite.analysis.run_analysis import analyse_run

    analysis = analyse_run(store, run_id, compare_levels=False)
    calls = analysis.calls
    api_of = {row["key"]: row["api"] for row in analysis.sites}
    targets = [i for i, key in enumerate(analysis.site_keys) if target in (key, api_of.get(key))]
    points = []
    mask_site = np.isin(calls["site"], targets)
    domain = analysis.domains[0]["domain"] if analysis.domains else None
    for rep in sorted(set(calls["rep"][mask_site].tolist())):
        mask = mask_site & (calls["rep"] == rep)
        sized = calls["in_bytes"][mask]
        sized = sized[sized >= 0]
        points.append(
            {
                "fraction": fraction,
                "rep": rep,
                "run_id": run_id,
                "calls": int(mask.sum()),
                "input_bytes": float(sized.max()) if sized.size else float("nan"),
                "seconds": float(calls["duration_s"][mask].sum()),
                "energy_J": float(calls["energy_J"][domain][mask].sum()) if domain else None,
                "provenance": analysis.domains[0]["provenance"] if domain else None,
                "peak_rss_B": float(np.nanmax(calls["rss_peak_B"][mask])) if mask.any() else None,
            }
        )
    return points
