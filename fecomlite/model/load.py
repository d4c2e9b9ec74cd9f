"""What load did to a sweep's repetitions, and the repetitions brought to one load.

Under contention a program's CPU time (and the cpu-process energy made from it) and its wall
time grow: threads wait for a CPU, and spinning ones count the wait as CPU time. A sweep records
each repetition's run-queue wait per CPU second (`analysis.contention`). Within a
configuration the work is the same in every repetition, so how its time and energy vary with
that wait is the load's effect alone: y = y₀·exp(γ·wait), γ fitted on the repetitions' logs
less their configuration's mean log (the effect is multiplicative, and far from linear on a
machine loaded several times over: times of one configuration seen to vary 7× as its wait
went from 1.3 to 3.2 s per CPU second). Where γ is clearly positive (beyond twice its
standard error), each repetition is brought to the sweep's median wait before the fit, so the
model's residuals hold what the configurations differ by, not what the machine did meanwhile;
its predictions are then for that median load (said beside them).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SIGNIFICANT = 2.0  # a slope at least twice its standard error


def within_slope(y: np.ndarray, wait: np.ndarray, group: np.ndarray) -> tuple[float, float]:
    """(γ, its standard error) of log y = log y₀ + γ·wait within configurations: each
    repetition's log against its configuration's mean log, over its wait less the
    configuration's mean wait (NaN without enough repetitions that differ in wait)."""
    configs = int(group.max()) + 1
    counts = np.bincount(group, minlength=configs).astype(float)
    logs = np.log(y)
    dy = logs - (np.bincount(group, weights=logs, minlength=configs) / counts)[group]
    dw = wait - (np.bincount(group, weights=wait, minlength=configs) / counts)[group]
    spread = float(np.sum(dw**2))
    dof = y.size - configs - 1
    if dof < 2 or spread <= 0:
        return math.nan, math.nan
    slope = float(np.sum(dy * dw) / spread)
    return slope, math.sqrt(float(np.sum((dy - slope * dw) ** 2)) / dof / spread)


def normalise(
    y: np.ndarray, wait: np.ndarray, group: np.ndarray, what: str
) -> tuple[np.ndarray, dict[str, Any]]:
    """y brought to the median wait where load clearly affected it, and what was done, in
    words (`applied` false: y unchanged)."""
    info: dict[str, Any] = {"what": what, "applied": False}
    if not np.all(np.isfinite(wait)) or wait.size == 0:
        info["text"] = f"{what}: the repetitions' load was not recorded"
        return y, info
    slope, se = within_slope(y, wait, group)
    reference = float(np.median(wait))
    info.update(gamma=slope if math.isfinite(slope) else None,
                gamma_se=se if math.isfinite(se) else None, reference_wait_per_cpu_s=reference,
                wait_range=[float(wait.min()), float(wait.max())])
    if not (math.isfinite(slope) and slope > SIGNIFICANT * se and slope > 0):
        info["text"] = (f"{what}: no clear effect of load across the repetitions "
                        f"(waits {wait.min():.2f}–{wait.max():.2f} s per CPU s)")
        return y, info
    info["applied"] = True
    info["text"] = (f"{what}: ×{math.exp(slope):.3g} per second of run-queue wait per CPU "
                    f"second (γ {slope:.2f} ± {se:.2f} on the log scale); repetitions brought to "
                    f"the sweep's median wait of {reference:.2f} s per CPU s, and predictions "
                    "are for that load")
    return y * np.exp(slope * (reference - wait)), info


def at_wait(mean: float, sd: float, info: dict[str, Any], wait: float) -> tuple[float, float]:
    """(mean, sd) of a prediction made at the sweep's median wait, moved to `wait` (s per CPU
    s) by the fitted effect, γ's own uncertainty added on the log scale; unchanged where no
    effect was applied."""
    if not info.get("applied") or mean <= 0:
        return mean, sd
    delta = wait - float(info["reference_wait_per_cpu_s"])
    factor = math.exp(float(info["gamma"]) * delta)
    relative = math.hypot(sd / mean, float(info["gamma_se"]) * delta)
    return mean * factor, mean * factor * relative
