"""The stability gate run before a repetition: is the machine cool and quiet enough to measure?

Checks (FECoM's thresholds by default): temperature at or under a limit (CPU 55 °C, GPU 40 °C);
power σ/mean under a ratio (CPU/DRAM 0.03, GPU 0.01) over the last `window` power values (a
power sensor's readings, a counter's power over `bin_s` bins: see series.py); utilisation σ
under `util_std_max_pp` percentage points over the same window, and the machine *quiet*: its
mean utilisation (other processes: the program is not running yet) at most `util_quiet_max_pct`
% of all CPUs, since a stable but busy machine makes every machine-level above-idle figure
wrong; and each GPU quiet: the SM utilisation of the processes on it (NVML's per-process
accounting; nobody's program is running yet, so all of it is other processes') at most
`gpu_quiet_max_pct` %. The verdict says what it could not check (no temperature, no machine
utilisation, a GPU without per-process utilisation) and says "no GPU" where there is none.
The wait is bounded by
`max_wait_s`: a gate that cannot be met is reported as failed, never looped on. Only samples
taken after the gate began count, so the verdict is about now, not about the repetition before;
or, with `lookback_s`, from that long before (the caller knows the machine was left alone then:
its idle baseline, or a tail back at the baseline), so that a machine already quiet and stable
passes at once.

What is gated is the machine: the measured program's own sensors (device `process`: its CPU
time, its estimated CPU power) describe a program that is not running then, and are left out.
An estimated power (no RAPL) is a linear function of machine utilisation, which is gated
directly with a threshold made for it; σ/mean of the estimate would gate the same signal again
against a ratio made for RAPL, which a shared VM's background load never meets.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from fecomlite.sensors.nvml import OTHER_PROCESSES
from fecomlite.server.series import BIN_S, POWER_KINDS, Series, power_values

MAX_WAIT_LIMIT_S = 3600.0
NO_READINGS_GRACE_S = 2.0  # how long a sensor may stay silent before the gate goes without it


@dataclass(frozen=True)
class GateThresholds:
    cpu_temp_max_c: float = 55.0
    gpu_temp_max_c: float = 40.0
    cpu_power_cv_max: float = 0.03  # σ/mean, CPU package/core and DRAM
    gpu_power_cv_max: float = 0.01  # σ/mean, GPUs
    util_std_max_pp: float = 5.0  # σ of utilisation, percentage points
    util_quiet_max_pct: float = 10.0  # mean machine utilisation, % of all CPUs: quiet
    gpu_quiet_max_pct: float = 10.0  # mean SM utilisation of the processes on a GPU: quiet
    window: int = 20  # the last N power/utilisation values
    bin_s: float = BIN_S  # a counter's power is taken over bins this long
    max_wait_s: float = 120.0
    poll_s: float = 0.1  # how soon a verdict is seen: the window judged is the same
    lookback_s: float = 0.0  # samples from this long before the gate began count too

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> GateThresholds:
        """Thresholds from a request, refusing unknown names and values that could loop forever."""
        known = {f.name for f in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown gate thresholds: {sorted(unknown)}; known: {sorted(known)}")
        th = cls(**{k: float(v) if k != "window" else int(v) for k, v in values.items()})
        if not 0 <= th.max_wait_s <= MAX_WAIT_LIMIT_S:
            raise ValueError(f"max_wait_s must be within 0..{MAX_WAIT_LIMIT_S:g} s")
        if not 0 <= th.lookback_s <= MAX_WAIT_LIMIT_S:
            raise ValueError(f"lookback_s must be within 0..{MAX_WAIT_LIMIT_S:g} s")
        if th.window < 2 or th.poll_s <= 0 or th.bin_s <= 0:
            raise ValueError("window must be at least 2, poll_s and bin_s positive")
        return th


def gated(domain: str, kind: str) -> bool:
    """Whether the gate looks at a sensor of this domain and kind (memory it does not)."""
    return domain in ("temperature", "utilisation", OTHER_PROCESSES) or kind in POWER_KINDS


def of_the_machine(series: Series) -> bool:
    """Whether the gate judges this sensor: not the program's own, not utilisation again (an
    estimated power); see the module's docstring."""
    estimated_power = series.kind in POWER_KINDS and series.provenance == "estimated"
    return series.device != "process" and not estimated_power


def is_gpu(series: Series) -> bool:
    """GPU sensors: device or domain `gpu:N`, or anything read through NVML."""
    return (
        series.device.startswith("gpu")
        or series.domain.startswith("gpu:")
        or series.name.startswith("nvml:")
    )


def evaluate(series: list[Series], th: GateThresholds) -> list[dict[str, Any]]:
    """One check per gate-able sensor of the machine with samples: value, limit, passed, or
    pending (too few).

    A counter is not checked where a power sensor of the same domain is (NVML has both): the
    power sensor resolves stability better than the counter's binned power does.
    """
    powered = {s.domain for s in series if s.kind == "power" and s.values.size}
    checks = []
    for s in series:
        if s.values.size == 0 or (s.kind == "counter" and s.domain in powered):
            continue
        if not of_the_machine(s):
            continue
        gpu = is_gpu(s)
        if s.domain == "temperature":
            limit = th.gpu_temp_max_c if gpu else th.cpu_temp_max_c
            value = float(s.values[-1])
            checks.append(_check(s, "temperature", value, limit, value <= limit, 1, 1))
        elif s.kind in POWER_KINDS and s.unit in ("J", "W"):
            p = power_values(s, th.bin_s)[-th.window :]
            limit = th.gpu_power_cv_max if gpu else th.cpu_power_cv_max
            mean = float(p.mean()) if p.size else 0.0
            ratio = float(p.std() / mean) if p.size and mean > 0 else None
            ok = ratio is not None and ratio <= limit
            checks.append(_check(s, "power_cv", ratio, limit, ok, p.size, th.window))
        elif s.domain == OTHER_PROCESSES:
            u = s.values[-th.window :]
            mean = float(np.mean(u))
            checks.append(_check(s, "gpu_quiet", mean, th.gpu_quiet_max_pct,
                                 mean <= th.gpu_quiet_max_pct, u.size, th.window))
        elif s.domain == "utilisation":
            u = s.values[-th.window :]
            std = float(np.std(u))
            checks.append(
                _check(s, "utilisation_std", std, th.util_std_max_pp, std <= th.util_std_max_pp,
                       u.size, th.window)
            )
            if not gpu:  # GPU utilisation counts kernels of any process: no quiet level
                mean = float(np.mean(u))
                checks.append(_check(s, "utilisation_quiet", mean, th.util_quiet_max_pct,
                                     mean <= th.util_quiet_max_pct, u.size, th.window))
    return checks


def _check(
    s: Series, check: str, value: float | None, limit: float, ok: bool, n: int, needed: int
) -> dict[str, Any]:
    pending = n < needed
    return {
        "sensor": s.name, "check": check, "value": value, "limit": limit,
        "passed": ok and not pending, "pending": pending, "n": int(n), "needed": needed,
        "provenance": s.provenance,
    }


def wait_for_stable(
    fetch: Callable[[], list[Series]],
    th: GateThresholds,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> dict[str, Any]:
    """Poll `fetch` until every check passes or `max_wait_s` is spent; return the verdict.

    A sensor with no reading yet holds a passing verdict back for up to NO_READINGS_GRACE_S
    (it may simply not have been read since the gate began), then is reported and left out.
    """
    start = clock()
    while True:
        series = fetch()
        checks = evaluate(series, th)
        silent = [s.name for s in series if s.values.size == 0 and of_the_machine(s)]
        passed = bool(checks) and all(c["passed"] for c in checks)
        elapsed = clock() - start
        settled = not silent or elapsed >= min(th.max_wait_s, NO_READINGS_GRACE_S)
        if (passed or not checks) and settled or elapsed >= th.max_wait_s:
            break
        sleep(min(th.poll_s, th.max_wait_s - elapsed))
    return {
        "passed": passed or not checks,
        "gated": bool(checks),
        "waited_s": round(clock() - start, 3),
        "checked": checks,
        "reasons": _reasons(checks, silent, passed) + no_gpu(series),
        "not_checked": not_checked(series, checks),
        "thresholds": asdict(th),
    }


def not_checked(series: list[Series], checks: list[dict[str, Any]]) -> list[str]:
    """What the gate could not judge on this machine, in words for the report."""
    out = []
    if not any(c["check"] == "temperature" for c in checks):
        out.append("temperature: no sensor")
    if not any(c["check"] == "utilisation_quiet" for c in checks):
        out.append("whether other processes use the CPUs: no machine utilisation")
    quiet_checked = {gpu_of(s) for s in series if s.domain == OTHER_PROCESSES}
    for gpu in sorted({gpu_of(s) for s in series if is_gpu(s)} - quiet_checked):
        out.append(f"whether other processes use {gpu}: NVML gives no per-process utilisation")
    return out


def no_gpu(series: list[Series]) -> list[str]:
    """"no GPU" where the machine has none: nothing there was left unchecked."""
    return [] if any(is_gpu(s) for s in series) else ["no GPU"]


def gpu_of(series: Series) -> str:
    """The GPU a sensor reads, `gpu:N` (NVML sensors are named nvml:N:quantity)."""
    for label in (series.device, series.domain):
        if label.startswith("gpu:"):
            return label
    if series.name.startswith("nvml:"):
        return "gpu:" + series.name.split(":")[1]
    return "gpu"


def _reasons(checks: list[dict[str, Any]], silent: list[str], passed: bool) -> list[str]:
    if not checks:
        return ["no sensor gave readings to gate on: not gated"]
    reasons = [f"{name}: no readings, not gated" for name in silent]
    if not any(c["check"] == "temperature" for c in checks):
        power = any(c["check"] == "power_cv" for c in checks)
        reasons.append("no temperature sensor: gated on "
                       + ("power and utilisation alone" if power else "utilisation alone"))
    for c in checks:
        if c["pending"]:
            reasons.append(f"{c['sensor']}: only {c['n']} of {c['needed']} values in time")
        elif not c["passed"] and c["check"] == "gpu_quiet":
            reasons.append(f"{c['sensor']}: not quiet: other processes used {c['value']:.0f} % "
                           f"of the GPU's compute time before the program started (quiet is ≤ "
                           f"{c['limit']:g} %); that GPU's above-idle figures will include their "
                           "work")
        elif not c["passed"] and c["check"] == "utilisation_quiet":
            reasons.append(f"{c['sensor']}: not quiet: {c['value']:.0f} % of all CPUs busy "
                           f"before the program started (quiet is ≤ {c['limit']:g} %); "
                           "machine-level above-idle figures will include other processes' work")
        elif not c["passed"]:
            shown = "n/a" if c["value"] is None else f"{c['value']:.4g}"
            reasons.append(f"{c['sensor']}: {c['check']} {shown} over limit {c['limit']:g}")
    if passed:
        reasons.append("stable and quiet")
    return reasons
