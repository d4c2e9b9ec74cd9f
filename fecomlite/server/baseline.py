"""Cheap honest idle baselines and tails, decided from what the store already holds.

A run may reuse the idle baseline of a recent run of the same store when a short check now
agrees with it, sensor by sensor (the machine is in the state it was measured in); the reuse is
stored with the run (`idle_baseline`: `reused_from_run`, `age_s`, `check`) and printed. A tail
may end as soon as the machine's power is back at that baseline. Both compare a window's mean
power with the baseline's mean, within `TOLERANCE` of it or two of its standard deviations,
whichever is wider: the noise the baseline itself showed.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

from fecomlite.server.series import POWER_KINDS, Series, mean_power
from fecomlite.store import Store

TOLERANCE = 0.05  # relative difference of mean power still counted as the same state
CHECK_S = 1.0  # the short idle measurement a reuse is checked with


def latest_baseline(
    store: Store, run_id: int, max_age_s: float
) -> tuple[int, dict[str, Any], float] | None:
    """(run, baseline, age in s) of the newest idle baseline of another run measured at most
    `max_age_s` ago on this boot (the monotonic clock), or None."""
    latest = store.latest_run_with_result("idle_baseline", other_than=run_id)
    if latest is None:
        return None
    detail = store.result(latest, "idle_baseline") or {}
    origin = detail.get("reused_from_run", latest)
    age_s = (time.monotonic_ns() - int(detail.get("t_end_ns", 0))) / 1e9
    if not detail.get("sensors") or not 0 <= age_s <= max_age_s:
        return None
    return int(origin), detail, age_s


def agreement(check: dict[str, Any], baseline: dict[str, Any]) -> float | None:
    """The largest difference between `check`'s mean power and `baseline`'s, as a share of the
    allowed difference (≤ 1: the same state); None when a sensor showing power in one is
    missing from the other (another machine state by definition)."""
    now, then = check.get("sensors") or {}, baseline.get("sensors") or {}
    powered = {n for n, s in [*now.items(), *then.items()] if s["mean_w"] > 0}
    if not then or not powered <= (set(now) & set(then)):
        return None
    return max(_share(now[name]["mean_w"], then[name]) for name in set(now) & set(then))


def _share(mean_w: float, stats: dict[str, Any]) -> float:
    """|mean − baseline| over the allowed difference (max of TOLERANCE·baseline and 2σ)."""
    allowed = max(TOLERANCE * abs(stats["mean_w"]), 2 * (stats.get("std_w") or 0.0), 1e-9)
    return abs(mean_w - stats["mean_w"]) / allowed


def reuse(
    store: Store,
    run_id: int,
    origin: int,
    baseline: dict[str, Any],
    age_s: float,
    check: dict[str, Any],
    share: float,
) -> dict[str, Any]:
    """Make `baseline` (measured in run `origin`) this run's idle baseline, saying so."""
    detail = {
        **baseline,
        "reused_from_run": origin,
        "age_s": round(age_s, 1),
        "check": {
            "seconds": check.get("seconds"),
            "sensors": check.get("sensors"),
            "worst_share_of_tolerance": round(share, 3),
        },
    }
    store.update_run(run_id, idle={k: v["mean_w"] for k, v in baseline["sensors"].items()})
    store.put_result(run_id, "idle_baseline", detail)
    return detail


def machine_power(store: Store, run_id: int, since_ns: int) -> dict[str, float]:
    """Mean power (W) of each of the run's machine power sensors over the samples stored since
    `since_ns` (the writer commits every half second: the newest may not be there yet)."""
    means = {}
    for row in store.sensors(run_id):
        if row["kind"] not in POWER_KINDS:
            continue
        samples = store.samples(row["id"], since_ns)
        series = Series(
            row["name"],
            row["domain"],
            row["unit"],
            row["kind"],
            row["provenance"],
            row["model"],
            np.array([s[0] for s in samples], dtype=np.int64),
            np.array([s[1] for s in samples], dtype=float),
        )
        mean = mean_power(series) if len(samples) > 1 else None
        if mean is not None and math.isfinite(mean):
            means[row["name"]] = mean
    return means


def back_at_baseline(means: dict[str, float], baseline: dict[str, Any]) -> bool:
    """Every sensor of the baseline has a mean now, within the allowed difference of it."""
    stats = baseline.get("sensors") or {}
    return bool(stats) and all(
        name in means and _share(means[name], s) <= 1.0 for name, s in stats.items()
    )
