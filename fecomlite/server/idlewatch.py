"""The server's rolling estimate of the machine's idle power and conditions, kept between runs.

While no run records, one thread reads the machine's power, utilisation and temperature sensors
(its own instances: a sensor is only ever read by one thread) every `period_s`, slow sensors
(NVML energy: milliseconds a read) every `SLOW_PERIOD_S`, and keeps the last `keep_s` of
readings in memory; nothing is stored. Readings across a run are no stretch of idle: when a run
has recorded in between, a new stretch begins (the newest idle estimate of the old one is kept).

A run asks `estimate()` for a baseline: the newest window of `seconds` in which the machine was
quiet and stable (the gate's own checks, `fecomlite.server.gate`), its mean power and σ per
sensor (as a measured baseline has), and whether the machine's state when the run began (the
last `NOW_READINGS` readings) still matches it: the same sensors, power within the tolerance the
store-reuse check uses (`fecomlite.server.baseline`), the CPUs quiet, temperatures within
`TEMP_TOLERANCE_C`. A run's first gate may count the same readings (`series`): a machine
already quiet and stable then passes at once. Cost: one `/proc/stat` (and sysfs) read per
period, with nothing else running in the server.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from fecomlite.sensors.base import Sensor
from fecomlite.server.baseline import agreement
from fecomlite.server.gate import GateThresholds, evaluate, gated
from fecomlite.server.sampler import call_each
from fecomlite.server.series import POWER_KINDS, Series, idle_stats, mean_power

PERIOD_S = 0.25  # 20 readings (the gate's window) in 5 s, the default idle baseline
SLOW_PERIOD_S = 2.0  # a sensor whose read costs milliseconds
KEEP_S = 120.0  # readings kept in memory
NOW_READINGS = 4  # the machine's state "now": the last readings before a run began (1 s)
FRESH_S = 2.0  # the newest reading at most this old when a run began, or nothing is known of now
TEMP_TOLERANCE_C = 3.0  # a machine this much warmer or cooler is in another state
SEARCH_STEPS = 5  # windows looked at, newest first, a fifth of a window apart
MIN_VALUES = 3  # a sensor's values in a window, at least, for its checks to count


class IdleWatch:
    """Readings of `sensors` while `paused()` is false; estimates of idle from them."""

    def __init__(
        self,
        sensors: Sequence[Sensor],
        paused: Callable[[], bool],
        *,
        period_s: float = PERIOD_S,
        keep_s: float = KEEP_S,
        thresholds: GateThresholds | None = None,
    ) -> None:
        self._all = list(sensors)
        self.sensors = [s for s in sensors if gated(s.domain, s.kind)]
        self.period_s = period_s
        self.keep_s = keep_s
        self.thresholds = thresholds or GateThresholds()
        self._paused = paused
        self._lock = threading.Lock()
        self._stretch: deque[tuple[int, tuple[float | None, ...]]] = deque()
        self._kept: dict[str, Any] | None = None  # the newest idle window of an earlier stretch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="idle-watch", daemon=True)

    def start(self) -> None:
        if self.sensors:
            self._thread.start()
        else:
            call_each(self._all, "close")

    def close(self) -> None:
        """Stop reading; the sensors are closed by the thread that read them."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        last_read = [0.0] * len(self.sensors)
        periods = [SLOW_PERIOD_S if getattr(s, "slow", False) else 0.0 for s in self.sensors]
        interrupted = False
        try:
            while not self._stop.wait(self.period_s):
                if self._paused():
                    interrupted = True
                    continue
                if interrupted:  # a rate's first read spans the run: read, and drop it
                    self._new_stretch()
                    interrupted = False
                    for sensor in self.sensors:
                        sensor.read()
                    continue
                now = time.monotonic()
                values = []
                for i, sensor in enumerate(self.sensors):
                    due = now - last_read[i] >= periods[i]
                    values.append(sensor.read() if due else None)
                    if due:
                        last_read[i] = now
                self._add(time.monotonic_ns(), tuple(values))
        finally:
            call_each(self._all, "close")

    def _add(self, t_ns: int, values: tuple[float | None, ...]) -> None:
        with self._lock:
            self._stretch.append((t_ns, values))
            while self._stretch and t_ns - self._stretch[0][0] > self.keep_s * 1e9:
                self._stretch.popleft()

    def _new_stretch(self) -> None:
        """A run recorded since the last reading: keep the old stretch's newest idle window."""
        kept = self._search(self._snapshot(), seconds=self.thresholds.window * self.period_s)
        with self._lock:
            if kept is not None:
                self._kept = kept
            self._stretch.clear()

    def _snapshot(self) -> list[tuple[int, tuple[float | None, ...]]]:
        with self._lock:
            return list(self._stretch)

    # -- what a run asks -----------------------------------------------------------------------

    def series(self, since_ns: int, until_ns: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each sensor's readings in [since_ns, until_ns): (t_ns, values)."""
        rows = [r for r in self._snapshot() if since_ns <= r[0] < until_ns]
        return {s.name: _column(rows, i) for i, s in enumerate(self.sensors)}

    def estimate(
        self, seconds: float, max_age_s: float, began_ns: int, until_ns: int | None = None
    ) -> dict[str, Any]:
        """The newest quiet, stable window of at least `seconds` ended at most `max_age_s`
        before `began_ns` (a run's start), if the machine's state then still matches it:
        {"sensors", "t_start_ns", "t_end_ns", "seconds", "age_s", "now", ...}; otherwise
        {"refused": why}. Only readings before `until_ns` (default `began_ns`) are judged: the
        client's own start-up, before it began the run, is not the machine's state."""
        until_ns = began_ns if until_ns is None else min(until_ns, began_ns)
        rows = [r for r in self._snapshot() if r[0] < until_ns]
        if not rows or (until_ns - rows[-1][0]) / 1e9 > FRESH_S:
            return {"refused": "the server has no readings of the machine just before the run "
                               "(it was recording another run, or has just started)"}
        found = self._search(rows, seconds)
        with self._lock:
            kept = self._kept
        if found is None and kept is not None and kept["seconds"] >= seconds - self.period_s:
            found = kept
        if found is None:
            return {"refused": f"no {seconds:g} s of readings between runs in which the machine "
                               "was quiet and stable"}
        age_s = (began_ns - found["t_end_ns"]) / 1e9
        if age_s > max_age_s:
            return {"refused": f"the newest quiet, stable stretch ended {age_s:.0f} s ago "
                               f"(at most {max_age_s:g} s)"}
        now = _state(self._series(rows[-NOW_READINGS:]))
        why = self._differs(now, found)
        if why:
            return {"refused": f"the machine's state changed since: {why}"}
        return {**found, "age_s": round(age_s, 1), "now": now, "period_s": self.period_s}

    # -- the arithmetic ------------------------------------------------------------------------

    def _search(
        self, rows: list[tuple[int, tuple[float | None, ...]]], seconds: float
    ) -> dict[str, Any] | None:
        """The newest window of `seconds` whose readings pass the gate's checks, as a baseline."""
        step = max(1, round(seconds / SEARCH_STEPS / self.period_s))
        times = [r[0] for r in rows]
        end = len(rows)
        while end > 0:
            start = bisect.bisect_left(times, times[end - 1] - int(seconds * 1e9))
            window = rows[start:end]
            if (window[-1][0] - window[0][0]) / 1e9 >= seconds - self.period_s:
                series = self._series(window)
                checks = evaluate(series, dataclasses.replace(self.thresholds, window=len(window)))
                if checks and all(_within(c) for c in checks):
                    return self._baseline(window, series, checks)
            elif start == 0:  # (a late reading may shorten one window, not all before it)
                return None
            end -= step
        return None

    def _series(self, rows: list[tuple[int, tuple[float | None, ...]]]) -> list[Series]:
        out = []
        for i, s in enumerate(self.sensors):
            t, v = _column(rows, i)
            out.append(Series(s.name, s.domain, s.unit, s.kind, s.provenance,
                              getattr(s, "model", None), t, v, getattr(s, "device", "")))
        return out

    def _baseline(
        self, rows: list[tuple[int, tuple[float | None, ...]]], series: list[Series],
        checks: list[dict[str, Any]],
    ) -> dict[str, Any]:
        stats = {s.name: st for s in series
                 if s.kind in POWER_KINDS and (st := idle_stats(s)) is not None}
        return {
            "seconds": round((rows[-1][0] - rows[0][0]) / 1e9, 2),
            "t_start_ns": rows[0][0],
            "t_end_ns": rows[-1][0],
            "readings": len(rows),
            "sensors": stats,
            "conditions": _state(series),
            "checked": [{k: c[k] for k in ("sensor", "check", "value", "limit")}
                        for c in checks],
        }

    def _differs(self, now: dict[str, Any], then: dict[str, Any]) -> str | None:
        """Why the machine's state `now` is not the one the estimate `then` was made in."""
        share = agreement({"sensors": {n: {"mean_w": w} for n, w in now["power_w"].items()}},
                          then)
        if share is None:
            return "its power sensors differ"
        if share > 1.0:
            return f"power differs by {share:.1f}× the tolerance"
        for name, pct in now["utilisation_pct"].items():
            if name in then["conditions"]["utilisation_pct"] and \
                    pct > self.thresholds.util_quiet_max_pct:
                return f"{name}: {pct:.0f} % of all CPUs busy"
        for name, c in now["temperature_c"].items():
            old = then["conditions"]["temperature_c"].get(name)
            if old is None or abs(c - old) > TEMP_TOLERANCE_C:
                return f"{name}: {c:.0f} °C, then {old if old is None else round(old)} °C"
        return None


def _state(series: list[Series]) -> dict[str, Any]:
    """Mean power per power sensor, mean utilisation, last temperature: a machine's state."""
    state: dict[str, Any] = {"power_w": {}, "utilisation_pct": {}, "temperature_c": {}}
    for s in series:
        if s.values.size == 0:
            continue
        if s.kind in POWER_KINDS:
            mean = mean_power(s) if s.values.size > 1 or s.kind == "power" else None
            if mean is not None:
                state["power_w"][s.name] = mean
        elif s.domain == "utilisation":
            state["utilisation_pct"][s.name] = float(s.values.mean())
        elif s.domain == "temperature":
            state["temperature_c"][s.name] = float(s.values[-1])
    return state


def _within(check: dict[str, Any]) -> bool:
    """A gate check passed on the window's values (however many a sensor gave: a slow one, or
    a utilisation's first read, gives fewer than the window's readings)."""
    value = check["value"]
    enough = check["n"] >= min(MIN_VALUES, check["needed"])  # a temperature needs one
    return enough and value is not None and value <= check["limit"]


def _column(
    rows: list[tuple[int, tuple[float | None, ...]]], i: int
) -> tuple[np.ndarray, np.ndarray]:
    kept = [(t, v[i]) for t, v in rows if v[i] is not None]
    return (np.array([t for t, _ in kept], dtype=np.int64),
            np.array([v for _, v in kept], dtype=float))
