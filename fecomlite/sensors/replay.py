"""Recorded traces played back as sensors: for tests, and for users who bring measurements from an
external meter (a wall-power logger, a recorded NVML trace).

A trace is a CSV with a `t_ns` column (CLOCK_MONOTONIC ns) and value columns whose name ends in
their unit, as in tests/fixtures/h200-nvml/: `energy_mJ` (a counter), `power_avg_mW`,
`power_instant_mW` (power), `temp_C`, `mem_used_B` (gauges). Values are converted to the units
sensors use (J, W, C, B). The value at a time is the last sample at or before it (a sensor holds
its value until it updates).

`ReplaySensor` plays a trace in real time: on the first read the trace's start is pinned to the
clock, and every read returns the value current `now − start` into the trace (None past the end).
`load_trace` gives the arrays, for attribution tests.
"""

from __future__ import annotations

import csv
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fecomlite.sensors.base import COUNTER, GAUGE, POWER, BaseSensor

# column suffix -> (unit, factor to that unit)
UNITS: dict[str, tuple[str, float]] = {
    "uJ": ("J", 1e-6), "mJ": ("J", 1e-3), "J": ("J", 1.0),
    "uW": ("W", 1e-6), "mW": ("W", 1e-3), "W": ("W", 1.0),
    "mC": ("C", 1e-3), "C": ("C", 1.0),
    "B": ("B", 1.0), "KiB": ("B", 1024.0), "MiB": ("B", 2.0**20),
    "pct": ("%", 1.0),
}
_KINDS = {"J": COUNTER, "W": POWER}


@dataclass(frozen=True)
class Trace:
    """One value column of a recorded trace, in sensor units."""

    column: str
    unit: str
    kind: str
    t_ns: np.ndarray  # int64, increasing
    values: np.ndarray  # float64

    @property
    def duration_ns(self) -> int:
        return int(self.t_ns[-1] - self.t_ns[0])

    def value_at(self, t_ns: int) -> float | None:
        """The last sample at or before `t_ns` (trace clock), or None outside the trace."""
        if t_ns < self.t_ns[0] or t_ns > self.t_ns[-1]:
            return None
        return float(self.values[np.searchsorted(self.t_ns, t_ns, side="right") - 1])


def unit_of(column: str) -> tuple[str, float]:
    """(sensor unit, factor) from a column name's suffix: `energy_mJ` -> ("J", 1e-3)."""
    suffix = column.rsplit("_", 1)[-1]
    if suffix not in UNITS:
        raise ValueError(f"column {column!r}: unknown unit suffix (known: {', '.join(UNITS)})")
    return UNITS[suffix]


def load_trace(path: str | Path, column: str) -> Trace:
    """One column of a trace CSV, converted to sensor units, sorted by time."""
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if "t_ns" not in header or column not in header:
            raise ValueError(f"{path}: needs columns t_ns and {column}, has {header}")
        it, iv = header.index("t_ns"), header.index(column)
        rows = [(int(r[it]), float(r[iv])) for r in reader if r]
    unit, factor = unit_of(column)
    t = np.array([r[0] for r in rows], dtype=np.int64)
    v = np.array([r[1] for r in rows], dtype=np.float64) * factor
    order = np.argsort(t, kind="stable")
    return Trace(column, unit, _KINDS.get(unit, GAUGE), t[order], v[order])


def trace_columns(path: str | Path) -> list[str]:
    """The value columns of a trace CSV."""
    with open(path, newline="") as f:
        return [c for c in next(csv.reader(f)) if c != "t_ns"]


class TracePlayer:
    """Maps the clock to a trace time: the trace's start (plus `offset_s`) at the first call."""

    def __init__(
        self, t0_ns: int, offset_s: float = 0.0, clock: Callable[[], int] = time.monotonic_ns
    ) -> None:
        self.t0_ns = t0_ns + int(offset_s * 1e9)
        self.clock = clock
        self.start_ns: int | None = None

    def now(self) -> int:
        now = self.clock()
        if self.start_ns is None:
            self.start_ns = now
        return self.t0_ns + now - self.start_ns


class ReplaySensor(BaseSensor):
    """A trace played in real time as a sensor (provenance `measured`: it was, elsewhere)."""

    def __init__(
        self, trace: Trace, *, name: str, domain: str, device: str = "replay",
        player: TracePlayer | None = None, nominal_period_s: float = 0.1, description: str = "",
    ) -> None:
        super().__init__(
            name=name, domain=domain, unit=trace.unit, kind=trace.kind, device=device,
            nominal_period_s=nominal_period_s,
            description=description or f"replay of column {trace.column}",
        )
        self.trace = trace
        self.player = player or TracePlayer(int(trace.t_ns[0]))

    def _read(self) -> float | None:
        return self.trace.value_at(self.player.now())


def fixture_sensors(
    directory: str | Path, *, gpu: int = 0, offset_s: float = 0.0,
    clock: Callable[[], int] = time.monotonic_ns,
) -> list[ReplaySensor]:
    """The sensors of a trace directory in the h200-nvml format, on one shared player.

    gpu_samples_energy.csv gives `replay:gpu:N:energy`; gpu_samples_power.csv gives one sensor
    per column (`replay:gpu:N:power_avg` ...), power in domain gpu:N, the rest as gauges.
    """
    directory = Path(directory)
    files = [directory / "gpu_samples_energy.csv", directory / "gpu_samples_power.csv"]
    traces = [load_trace(f, c) for f in files if f.exists() for c in trace_columns(f)]
    if not traces:
        raise FileNotFoundError(f"no gpu_samples_*.csv in {directory}")
    player = TracePlayer(min(int(t.t_ns[0]) for t in traces), offset_s, clock)
    domains = {"J": f"gpu:{gpu}", "W": f"gpu:{gpu}", "C": "temperature", "B": "gpu-memory"}
    return [
        ReplaySensor(
            t, name=f"replay:gpu:{gpu}:{t.column.rsplit('_', 1)[0]}",
            domain=domains.get(t.unit, "replay"), device=f"gpu:{gpu}", player=player,
            description=f"replay of {directory.name}/{t.column}",
        )
        for t in traces
    ]
