"""Cheap honest idle baselines and tails, decided from what the store already holds.

A run may reuse the idle baseline of a recent run of the same store when a short check now
agrees with it, sensor by sensor (the machine is in the state it was measured in); the reuse is
stored with the run (`idle_baseline`: `reused_from_run`, `age_s`, `check`) and printed. A tail
may end as soon as the machine's power is back at that baseline (`back_since`, judged by the
server as the samples come); where every power sensor is a model of CPU time (no RAPL, no GPU),
as soon as their readings cover none of the program (`lagless_tail_ns`). A reuse and a return
compare a mean power with the baseline's mean, within `TOLERANCE` of it or two of its standard
deviations, whichever is wider: the noise the baseline itself showed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable
from typing import Any

from fecomlite.sensors.estimate import CPU_MODEL, DRAM_MODEL, PROCESS_MODEL
from fecomlite.server.series import POWER_KINDS, Series, mean_power
from fecomlite.store import Store

TOLERANCE = 0.05  # relative difference of mean power still counted as the same state
CHECK_S = 1.0  # the short idle measurement a reuse is checked with
TAIL_WINDOW_S = 0.3  # a tail is judged on its newest readings over this long
TAIL_MIN_SPAN_S = 0.2  # ...once a sensor's readings after the program span this long
TAIL_MIN_READINGS = 3
# power estimated as a linear function of the CPU time read over each read window: no heat, no
# electrical or averaging lag of a chip behind it
LAGLESS_MODELS = frozenset({CPU_MODEL, DRAM_MODEL, PROCESS_MODEL})


def latest_baseline(
    store: Store, run_id: int, max_age_s: float, min_seconds: float = 0.0
) -> tuple[int, dict[str, Any], float] | None:
    """(run, baseline, age in s) of the newest idle baseline of another run measured at most
    `max_age_s` ago on this boot (the monotonic clock) over at least `min_seconds` (a `--quick`
    run's 1 s baseline is not what a careful run asked for), or None."""
    latest = store.latest_run_with_result("idle_baseline", other_than=run_id)
    if latest is None:
        return None
    detail = store.result(latest, "idle_baseline") or {}
    origin = detail.get("reused_from_run", latest)
    age_s = (time.monotonic_ns() - int(detail.get("t_end_ns", 0))) / 1e9
    if not detail.get("sensors") or not 0 <= age_s <= max_age_s:
        return None
    if float(detail.get("seconds") or 0.0) < min_seconds:
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
    return keep(store, run_id, detail)


def keep(store: Store, run_id: int, detail: dict[str, Any]) -> dict[str, Any]:
    """Make `detail` (measured, reused or estimated) the run's idle baseline: its means on the
    run, the whole as the run's `idle_baseline` result."""
    store.update_run(run_id, idle={k: v["mean_w"] for k, v in detail["sensors"].items()})
    store.put_result(run_id, "idle_baseline", detail)
    return detail


def back_since(
    series: list[Series], baseline: dict[str, Any], ended_ns: int, settle_ns: dict[str, int]
) -> int | None:
    """Since when every sensor of `baseline` reads back at it (or below) after a program ended at
    `ended_ns`, judged on its newest `TAIL_WINDOW_S` of readings (at least `TAIL_MIN_READINGS`,
    spanning `TAIL_MIN_SPAN_S`); None while one does not. A sensor's readings count from
    `settle_ns[name]` after the end: its first ones after it may still cover part of the program
    (a utilisation's window, a counter's step)."""
    stats = baseline.get("sensors") or {}
    by_name = {s.name: s for s in series}
    since = []
    for name, st in stats.items():
        s = by_name.get(name)
        if s is None:
            return None
        after = s.t_ns >= ended_ns + settle_ns.get(name, 0)
        t, v = s.t_ns[after], s.values[after]
        if t.size < TAIL_MIN_READINGS or t[-1] - t[0] < TAIL_MIN_SPAN_S * 1e9:
            return None
        newest = t >= t[-1] - int(TAIL_WINDOW_S * 1e9)
        mean = mean_power(dataclasses.replace(s, t_ns=t[newest], values=v[newest]))
        if mean is None or not math.isfinite(mean) or _share(max(mean, st["mean_w"]), st) > 1.0:
            return None  # (below the baseline is back too: what ran before us stopped)
        since.append(int(t[newest][0]))
    return max(since) if since else None


def lagless_tail_ns(sensors: Iterable[Any], settle_ns: dict[str, int]) -> int | None:
    """How long after the program's end its tail must last when every power sensor is a model
    of CPU time (`LAGLESS_MODELS`): until each one's readings cover none of the program (its
    settle). Such a "power" follows the CPU time of its read window and nothing else, so what it
    reads later is other processes' work, never the program's decaying: waiting for it to come
    back to the baseline only measures the neighbours (on a busy machine, the whole `tail_s`).
    None where a sensor measures power (RAPL, NVML: a chip's power and its sensor's averaging
    trail the work), or there is none: then the tail waits for the baseline."""
    power = [s for s in sensors if s.kind in POWER_KINDS]
    if not power or any(getattr(s, "model", None) not in LAGLESS_MODELS for s in power):
        return None
    return max(settle_ns.get(s.name, 0) for s in power)
