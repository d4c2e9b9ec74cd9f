"""Whether a run's figures are rough (`fecomlite run --quick`) and why, read from its settings:
every surface (HTML header, JSON, CSV, the terminal) says so beside the figures.

A quick run (one repetition, a 1 s idle baseline, no stability gate) cannot see how the
figures vary between repetitions, rests its idle σ on a few readings, and ran on a machine
nobody checked was quiet: its ± cover only what one repetition shows (`idle_sigma_bound`
widens the baseline's part to what its readings allow).
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

QUICK = "quick"
CAREFUL = "careful"
SHORT_BASELINE_S = 2.0  # an idle baseline shorter than this rests on a few readings


def run_mode(settings: dict[str, Any]) -> dict[str, Any]:
    """{"mode": "quick" | "careful", "reasons": [...], "text": one line for every surface}:
    quick is one repetition with no gate or a short baseline (what `--quick` sets)."""
    reasons = []
    repeat = settings.get("repeat")
    if isinstance(repeat, int) and repeat < 2:
        reasons.append("one repetition: how the figures vary between repetitions is not known")
    if settings.get("gate") is False:
        reasons.append("no stability gate: nobody checked the machine was quiet")
    idle = settings.get("idle_s")
    if isinstance(idle, (int, float)) and idle < SHORT_BASELINE_S:
        reasons.append(f"a {idle:g} s idle baseline")
    if not (isinstance(repeat, int) and repeat < 2) or len(reasons) < 2:
        # what `--quick` sets is one repetition and a short or ungated start: a careful run
        # with one rough setting is not called quick
        return {"mode": CAREFUL, "reasons": reasons, "text": ""}
    return {"mode": QUICK, "reasons": reasons,
            "text": "quick run, rough figures: " + "; ".join(reasons) + "."}


def idle_sigma_bound(sigma: float, readings: int | None) -> float:
    """The idle baseline's σ at the 95 % upper bound of what its readings allow (χ² with n − 1
    degrees of freedom, Wilson–Hilferty): a σ from 10 readings may be 1.6× too small, one from
    100 readings 1.1×. Unchanged when the count is not known."""
    if not math.isfinite(sigma) or readings is None or readings < 2:
        return sigma
    k = readings - 1
    z = NormalDist().inv_cdf(0.05)
    low = k * (1 - 2 / (9 * k) + z * math.sqrt(2 / (9 * k))) ** 3
    return sigma * math.sqrt(k / low) if low > 0 else math.inf
