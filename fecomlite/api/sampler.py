"""The sensors of `fecomlite.measure()`, read inside the user's process on one daemon thread.

The sensors are the server's (`fecomlite.sensors.discover`, this process as the measured tree),
chosen per energy domain the way the analysis chooses them, and read at the server's rates
(`SamplingRates`). The thread reads only while at least one measurement is open, keeps each
sensor's samples since the earliest open start, and parks (no timeout, no cost) otherwise. A
measurement's figures are the analysis's own arithmetic on those samples: `sensor_intervals` and
`window_energy` for energy, `gauge_during` for memory.
"""

from __future__ import annotations

import atexit
import bisect
import os
import threading
from array import array
from dataclasses import dataclass, field
from time import monotonic_ns
from typing import Any

import numpy as np

from fecomlite.analysis import attribution as at
from fecomlite.analysis.run_analysis import (
    GPU_MEMORY_DOMAINS,
    RSS_SENSOR,
    choose_energy_sensors,
    gauge_during,
)
from fecomlite.sensors import discover
from fecomlite.sensors.base import GAUGE, POWER, BaseSensor
from fecomlite.server.sampler import SamplingRates, sensor_details, sensor_row

PEAK_SENSOR = "proc:peak_rss"
MEMORY_DOMAINS = ("process-memory", *GPU_MEMORY_DOMAINS)
NS = 1_000_000_000
MAX_WAIT_S = 5.0


@dataclass(frozen=True)
class DomainEnergy:
    """One domain's energy over a window, with where it came from."""

    joules: float
    provenance: str  # "measured" | "estimated"
    sensor: str
    model: str | None  # the estimation model (fecomlite.sensors.MODELS), None when measured
    resolution_s: float  # the sensor's update period: shorter windows are below resolution


@dataclass
class _Series:
    sensor: BaseSensor
    interval_ns: int
    t: array = field(default_factory=lambda: array("q"))
    v: array = field(default_factory=lambda: array("d"))
    due_ns: int = 0  # when it is next read
    read_ns: int = 0  # when it was last read (even if it said nothing)


class Monitor:
    """One per process: the chosen sensors and the thread that reads them.

    A window is open from `open()` until the thread has read every sensor far enough past its
    end (`close()` returns at once; the thread finishes the window within about one update
    period of the slowest sensor, 0.1 s for the estimated CPU power, and then sets its event).
    """

    def __init__(self, settings: dict[str, Any] | None = None) -> None:
        found, self.notes = discover(os.getpid(), settings)
        rows = [sensor_row(s) for s in found]
        chosen, passed = choose_energy_sensors(rows, {s.name: sensor_details(s) for s in found})
        self.notes += passed
        energy_names = {row["name"] for row in chosen.values()}
        rates = SamplingRates()
        self._all = found
        self._series = {
            s.name: _Series(s, int(rates.interval(s) * NS))
            for s in found
            if s.name in energy_names or (s.kind == GAUGE and s.domain in MEMORY_DOMAINS)
        }
        self._open: list[int] = []  # token (a time before its start) of every open window
        self._ending: list[PendingWindow] = []
        self._cond = threading.Condition()
        self._stopped = False
        threading.Thread(target=self._loop, name="fecomlite-measure", daemon=True).start()
        atexit.register(self.stop)

    def open(self) -> tuple[int, int]:
        """Start a window: (its token, its start). An idle monitor reads every sensor once
        before the start (a few milliseconds), so the window has samples before it; while
        other windows are open the sensors are being read and nothing waits."""
        with self._cond:
            token = monotonic_ns()
            idle = not self._open  # else the sensors are being read already: no wait
            self._open.append(token)
            self._cond.notify_all()
            if idle:
                self._cond.wait_for(
                    lambda: self._read_since(token, 0.0) or self._stopped, timeout=MAX_WAIT_S
                )
            return token, monotonic_ns()

    def close(self, token: int, start: int, end: int) -> PendingWindow:
        """End a window; its samples come once every energy sensor was read one update period
        after `end` (that read covers the end) and every memory sensor after it."""
        pending = PendingWindow(token, start, end, monotonic_ns() + int(self._wait_s() * NS))
        with self._cond:
            self._ending.append(pending)
            self._cond.notify_all()
        return pending

    def stop(self) -> None:
        """Stop the reading thread (at exit); it finishes open windows and closes the sensors."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _wait_s(self) -> float:
        return 2 * max((s.sensor.period_s for s in self._series.values()), default=0.0) + 1.0

    def _read_since(self, t_ns: int, periods: float) -> bool:
        """Every sensor was read `periods` update periods (energy) or 0 (memory) after t."""
        for s in self._series.values():
            lag = s.sensor.period_s * periods if s.sensor.kind != GAUGE else 0.0
            if s.read_ns < t_ns + lag * NS:
                return False
        return True

    def _finish(self, now: int) -> None:
        """Hand every ending window that is covered (or waited long enough) its samples."""
        for pending in list(self._ending):
            if not (
                self._stopped or now >= pending.deadline_ns or self._read_since(pending.end_ns, 1.0)
            ):
                continue
            samples = {}
            for name, s in self._series.items():
                lo = max(bisect.bisect_left(s.t, pending.start_ns) - 2, 0)
                t, v = np.array(s.t[lo:], np.int64), np.array(s.v[lo:])
                samples[name] = (t, v, s.sensor)
            self._ending.remove(pending)
            self._open.remove(pending.token)
            self._trim()
            pending.window = Window(pending.start_ns, pending.end_ns, samples)
            pending.done.set()

    def _trim(self) -> None:
        """Forget samples no open window needs (two before its token are kept)."""
        for s in self._series.values():
            if not self._open:
                del s.t[:], s.v[:]
                continue
            keep = max(bisect.bisect_left(s.t, min(self._open)) - 2, 0)
            del s.t[:keep], s.v[:keep]

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._open or self._stopped)
                if self._stopped and not self._ending:
                    break
            now = monotonic_ns()
            read = []
            for s in self._series.values():
                if now >= s.due_ns:
                    read.append((s, s.sensor.read(), monotonic_ns()))
                    s.due_ns = now + s.interval_ns
            next_due = min((s.due_ns for s in self._series.values()), default=now + NS // 10)
            with self._cond:
                for s, value, t in read:
                    s.read_ns = t
                    if value is not None:
                        s.t.append(t)
                        s.v.append(value)
                self._finish(monotonic_ns())
                self._cond.notify_all()
                if self._open:
                    self._cond.wait(timeout=max(next_due - monotonic_ns(), 0) / NS)
        for sensor in self._all:
            sensor.close()


@dataclass
class PendingWindow:
    """A closed window waiting for the reads that cover its end."""

    token: int
    start_ns: int
    end_ns: int
    deadline_ns: int
    done: threading.Event = field(default_factory=threading.Event)
    window: Window | None = None

    def result(self, timeout: float = MAX_WAIT_S) -> Window:
        """The window's samples; after `timeout` an empty window (no figures)."""
        self.done.wait(timeout)
        return self.window or Window(self.start_ns, self.end_ns, {})


@dataclass(frozen=True)
class Window:
    """The samples of a closed window, and its figures."""

    start_ns: int
    end_ns: int
    samples: dict[str, tuple[np.ndarray, np.ndarray, BaseSensor]]

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / NS

    def energy(self) -> dict[str, DomainEnergy]:
        """Energy per domain in the window (total, idle included), from the chosen sensors."""
        out: dict[str, DomainEnergy] = {}
        for t, v, sensor in self.samples.values():
            if sensor.kind == GAUGE:
                continue
            try:
                intervals = _intervals(sensor, t, v)
            except ValueError:
                continue
            if intervals.count == 0:
                continue
            total, _ = at.window_energy(intervals, 0.0, self.start_ns, self.end_ns)
            out[sensor.domain] = DomainEnergy(
                total, sensor.provenance, sensor.name, sensor.model, sensor.period_s
            )
        return out

    def memory(self) -> dict[str, tuple[float, float, float]]:
        """(value at start, value at end, peak) in bytes for host RSS and each GPU memory
        domain. The host peak includes the kernel's high-water mark when it rose inside."""
        out: dict[str, tuple[float, float, float]] = {}
        for name, (t, v, sensor) in self.samples.items():
            if sensor.kind != GAUGE or name == PEAK_SENSOR or t.size == 0:
                continue
            bounds = np.array([self.start_ns]), np.array([self.end_ns])
            start, end, peak = (float(x[0]) for x in gauge_during(t, v, *bounds))
            key = "host" if name == RSS_SENSOR else sensor.domain
            if key in out:  # several GPUs: summed
                a, b, c = out[key]
                start, end, peak = start + a, end + b, peak + c
            out[key] = (start, end, peak)
        hwm = self.samples.get(PEAK_SENSOR)
        if "host" in out and hwm is not None and hwm[0].size:
            t, v, _ = hwm
            before, after, _ = gauge_during(
                t, v, np.array([self.start_ns]), np.array([self.end_ns])
            )
            if after[0] > before[0]:  # the process's high-water mark was set inside the window
                start, end, peak = out["host"]
                out["host"] = (start, end, max(peak, float(after[0])))
        return out


def _intervals(sensor: BaseSensor, t: np.ndarray, v: np.ndarray) -> at.SensorIntervals:
    """A sensor's samples as energy intervals. A power source that is fresh on every read (an
    estimate computed at the read) reports the mean since its previous read, so every read is an
    update even when the value repeats (a machine at full load); the analysis's change detection
    would see no update there."""
    if sensor.kind != POWER or sensor.watch_period or t.size == 0:
        return at.sensor_intervals(sensor.kind, t, v, period_s=sensor.period_s)
    lead = t[0] - int(sensor.period_s * NS)
    edges = np.concatenate(([lead], t))
    energy = np.diff(edges) / NS * v
    return at.SensorIntervals(edges, energy, np.zeros(edges.size), 0.0, sensor.period_s)


_monitor: Monitor | None = None
_lock = threading.Lock()


def _forget_in_child() -> None:
    """A forked child has no reading thread: it discovers its own monitor on first use."""
    global _monitor
    _monitor = None


os.register_at_fork(after_in_child=_forget_in_child)


def monitor() -> Monitor:
    """The process's monitor, discovered on first use (sensors are found once)."""
    global _monitor
    with _lock:
        if _monitor is None:
            _monitor = Monitor()
        return _monitor
