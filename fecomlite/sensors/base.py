"""The one sensor protocol, the base class every source builds on, and period measurement.

A sensor is read by the server's sampler threads, never by a probe. Reads must be cheap and must
never raise: a transient failure (a process that exited, a driver hiccup) reads as `None`, and the
error is kept in `last_error` for the report instead of being lost.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

MEASURED = "measured"
ESTIMATED = "estimated"

COUNTER = "counter"  # cumulative, monotonically increasing (J); energy = difference of two reads
POWER = "power"  # instantaneous or averaged power (W)
GAUGE = "gauge"  # a level: memory (B), temperature (C), utilisation (%)


@runtime_checkable
class Sensor(Protocol):
    """What the server and the store rely on (docs/internals.md §3)."""

    name: str
    domain: str
    unit: str
    kind: str
    provenance: str
    model: str | None
    period_s: float

    def read(self) -> float | None: ...


class BaseSensor:
    """Common metadata and the never-raising `read()` around a subclass's `_read()`.

    Attributes beyond the protocol, for the server and the report:
    device          what is measured: "cpu", "machine", "process", "gpu:N"
    model_params    the estimation model's parameters (empty when measured)
    nominal_period_s the documented update period, used when it cannot be measured
    period_source   "measured" once `measure_period` saw the value change, else "nominal"
    watch_period    False for sources that are fresh on every read (e.g. /proc statm): their
                    period is the sampling period we choose, not something to discover
    slow            a read costs milliseconds: give the sensor its own sampler thread
    read_cost_s     median seconds per read, measured by `measure_period`
    averaging_s     the source's own smoothing window (e.g. NVML average power ≈ 1 s), or None

    A source whose reads are nothing but `KernelFile` reads (and arithmetic on them) says so by
    listing the files in a `kernel_files()` method: the sampler may then read those files on its
    C tick thread and run `read()` later on what was read then (sensors/_files.py).
    A source whose value is a rate over the time since its previous read has a `restart()`: the
    sampler calls it on the reading thread when it resumes after a pause, so that no value spans
    the pause.
    """

    def __init__(
        self,
        *,
        name: str,
        domain: str,
        unit: str,
        kind: str,
        device: str,
        nominal_period_s: float,
        provenance: str = MEASURED,
        model: str | None = None,
        model_params: dict[str, Any] | None = None,
        watch_period: bool = True,
        slow: bool = False,
        averaging_s: float | None = None,
        description: str = "",
    ) -> None:
        self.name = name
        self.domain = domain
        self.unit = unit
        self.kind = kind
        self.device = device
        self.provenance = provenance
        self.model = model
        self.model_params = dict(model_params or {})
        self.nominal_period_s = nominal_period_s
        self.period_s = nominal_period_s
        self.period_source = "nominal"
        self.watch_period = watch_period
        self.slow = slow
        self.read_cost_s: float | None = None
        self.averaging_s = averaging_s
        self.description = description
        self.last_error: str | None = None
        self.error_count = 0

    def read(self) -> float | None:
        """One value in `unit`, or None when the source has nothing now. Never raises."""
        try:
            return self._read()
        except Exception as exc:  # a sensor must never take the sampler down
            self.error_count += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            return None

    def _read(self) -> float | None:
        raise NotImplementedError

    def close(self) -> None:
        """Release file descriptors or handles; the default holds none."""

    @property
    def sample_period_s(self) -> float:
        """How often the sampler should read: twice per update period for sources that update
        on their own clock, once per chosen period for sources that are fresh on every read."""
        return self.period_s / 2 if self.watch_period else self.period_s

    def metadata(self) -> dict[str, Any]:
        """Everything the store's `sensors` row and the report need (model_params included)."""
        return {
            "name": self.name,
            "domain": self.domain,
            "unit": self.unit,
            "kind": self.kind,
            "provenance": self.provenance,
            "model": self.model,
            "period_s": self.period_s,
            "device": self.device,
            "model_params": self.model_params,
            "period_source": self.period_source,
            "slow": self.slow,
            "read_cost_s": self.read_cost_s,
            "averaging_s": self.averaging_s,
            "description": self.description,
        }

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name} {self.domain} {self.kind} {self.unit} "
            f"{self.provenance} period={self.period_s:g}s>"
        )


@dataclass(frozen=True)
class PeriodMeasurement:
    """What `measure_period` found, so the server can record how the period was obtained."""

    period_s: float
    source: str  # "measured" | "nominal"
    changes: int  # value changes seen
    reads: int
    elapsed_s: float
    read_cost_s: float | None  # median seconds per read
    note: str


def measure_period(
    sensor: BaseSensor, max_s: float = 1.0, min_changes: int = 4
) -> PeriodMeasurement:
    """Watch the value change for at most `max_s` seconds; the period is the typical time between
    changes (see `_period_from_gaps`).

    Stops as soon as `min_changes` changes were seen (a RAPL counter takes milliseconds, an NVML
    counter about 0.4 s). With fewer than 3 changes within `max_s` (an idle gauge) the sensor
    keeps its documented nominal period, and says so. A source that is fresh on every read
    (`watch_period` False) keeps its nominal period and only has its read cost measured, over 5
    reads spaced like the sampler's (at most `max_s`). Sets `sensor.period_s`,
    `sensor.period_source` and `sensor.read_cost_s`.
    """
    if not sensor.watch_period:
        start = time.perf_counter()
        cost = _median_read_cost(sensor, reads=5, gap_s=min(sensor.nominal_period_s, max_s / 5))
        return _settle(sensor, sensor.nominal_period_s, "nominal", 0, 5,
                       time.perf_counter() - start, cost,
                       "fresh on every read: the period is the chosen sampling period")
    poll_s = min(max(sensor.nominal_period_s / 20, 1e-4), 0.02)
    costs: list[float] = []
    change_times: list[float] = []
    start = time.perf_counter()
    last = sensor.read()
    prev_end = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        value = sensor.read()
        t1 = time.perf_counter()
        costs.append(t1 - t0)
        if value is not None and last is not None and value != last:
            change_times.append((prev_end + t0) / 2)  # it changed between the two reads
        if value is not None:
            last = value
        prev_end = t1
        if len(change_times) >= min_changes or t1 - start >= max_s:
            break
        time.sleep(poll_s)
    elapsed = time.perf_counter() - start
    cost = statistics.median(costs)
    if len(change_times) >= 3:
        gaps = [b - a for a, b in pairwise(change_times)]
        period = _period_from_gaps(gaps)
        return _settle(sensor, period, "measured", len(change_times), len(costs) + 1, elapsed,
                       cost, f"median of {len(gaps)} intervals between changes")
    note = f"only {len(change_times)} changes in {max_s:g} s: nominal period"
    return _settle(sensor, sensor.nominal_period_s, "nominal", len(change_times), len(costs) + 1,
                   elapsed, cost, note)


def _period_from_gaps(gaps: list[float]) -> float:
    """The update period from times between changes, some of which span several updates.

    A source can update without changing its value (idle power repeats to the milliwatt), so a
    gap may be 2 or 3 periods. Each gap is divided by its multiple of the shortest one before
    taking the median.
    """
    shortest = min(gaps)
    return statistics.median(g / max(round(g / shortest), 1) for g in gaps)


def _median_read_cost(sensor: BaseSensor, reads: int, gap_s: float) -> float:
    """Reads spaced like the sampler's, so a source that caches within a window is not flattered."""
    costs = []
    for _ in range(reads):
        time.sleep(gap_s)
        t0 = time.perf_counter()
        sensor.read()
        costs.append(time.perf_counter() - t0)
    return statistics.median(costs)


def _settle(
    sensor: BaseSensor, period: float, source: str, changes: int, reads: int, elapsed: float,
    cost: float, note: str,
) -> PeriodMeasurement:
    sensor.period_s = period
    sensor.period_source = source
    sensor.read_cost_s = cost
    return PeriodMeasurement(period, source, changes, reads, elapsed, cost, note)
