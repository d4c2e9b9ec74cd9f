"""Reads every sensor on its own schedule while a run records, and writes the samples in batches.

Threads: one writer that commits what was read every `flush_s` in one transaction, on its own
SQLite connection; the C tick thread (server/capture.py) for the sensors whose reads are
kernel-file reads, decoded by the writer before each write; a Python scheduler for the other
cheap sensors (one grid of ticks; e.g. NVML power), and one thread per `slow` sensor (an NVML
energy read takes ~4 ms and must not delay the 200 Hz memory reader). Without the C part every
cheap sensor goes to the Python scheduler. Readers never touch SQLite: they append to a
lock-free deque. With no run recording every thread parks without a timeout, and the server
costs nothing. A sensor is only ever read, and closed, by the one thread that samples it.

Sensors come in groups: the machine's (fixed) and the watched process's (replaced when the pid
changes). The writer registers a sensor in a run's `sensors` table the first time it stores one
of its samples for that run.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fecomlite.sensors.base import Sensor
from fecomlite.server import capture
from fecomlite.store import Store

MAX_NAP_S = 0.05


@dataclass(frozen=True)
class SamplingRates:
    """Each sensor is read at its `sample_period_s` (half its update period), within bounds."""

    min_interval_s: float = 0.01  # 100 Hz at most (RAPL updates every 1 ms: a counter loses
    memory_interval_s: float = 0.005  # nothing); process memory up to 200 Hz (the sensors
    max_interval_s: float = 0.5  # package asks for 200 Hz RSS; its VmHWM peak needs less)

    def interval(self, sensor: Sensor) -> float:
        wanted = getattr(sensor, "sample_period_s", None) or (sensor.period_s or 0.1) / 2
        floor = self.memory_interval_s if sensor.domain == "process-memory" else self.min_interval_s
        return min(max(wanted, floor), self.max_interval_s)


def sensor_row(sensor: Sensor) -> dict[str, Any]:
    """The `sensors` table columns of a sensor (its run id aside)."""
    return {
        "name": sensor.name, "domain": sensor.domain, "unit": sensor.unit, "kind": sensor.kind,
        "provenance": sensor.provenance, "model": getattr(sensor, "model", None),
        "period_s": getattr(sensor, "period_s", None),
    }


def sensor_details(sensor: Sensor) -> dict[str, Any]:
    """Everything known about a sensor (the sensors package's `metadata()` where it has one)."""
    metadata = getattr(sensor, "metadata", None)
    return metadata() if callable(metadata) else sensor_row(sensor)


@dataclass
class _Recording:
    since_ns: int
    ids: dict[str, int] = field(default_factory=dict)  # sensor name -> sensors.id of this run


class Sampler:
    """Samples its sensors while at least one run records; writes to the store at `store_path`."""

    def __init__(
        self,
        sensors: Sequence[Sensor],
        store_path: Path,
        *,
        rates: SamplingRates | None = None,
        flush_s: float = 0.5,
        use_ticker: bool = True,
    ) -> None:
        """`use_ticker=False` reads every cheap sensor in Python (as without the C part)."""
        self.rates = rates or SamplingRates()
        self.store_path = store_path
        self.flush_s = flush_s
        self.use_ticker = use_ticker and capture.AVAILABLE
        self.errors: dict[str, int] = {}
        self._groups: dict[str, list[Sensor]] = {"machine": list(sensors)}
        self._retired: list[Sensor] = []
        self._owners: dict[int, int | None] = {}  # id(sensor) -> the run it records for alone
        self._version = 0
        self._queue: deque[tuple[Sensor, int, float]] = deque()
        self._recordings: dict[int, _Recording] = {}
        self._lock = threading.Lock()
        self._active = threading.Event()  # set while any run records
        self._stop = threading.Event()
        self._wake_writer = threading.Event()
        self._regrouped = threading.Event()  # wakes a scheduler parked without sensors
        self._writer_keeps_time = False  # the writer wakes itself (it drains the tick thread)
        self._grid_ticking = False  # the Python scheduler has sensors (and wakes the writer)
        self._written = threading.Condition()
        self._started = 0  # writes begun
        self._generation = 0  # writes done
        self._threads: list[threading.Thread] = []

    # -- sensors -------------------------------------------------------------------------------

    @property
    def sensors(self) -> list[Sensor]:
        with self._lock:
            return [s for group in self._groups.values() for s in group]

    def interval(self, sensor: Sensor) -> float:
        return self.rates.interval(sensor)

    def set_group(
        self, group: str, sensors: Sequence[Sensor], owner: int | None = None
    ) -> None:
        """Replace a group of sensors (e.g. a run's process's, for a new pid); the old ones are
        closed by the threads that read them. With an `owner` run, the group's samples go to
        that run only (its own process tree), else to every recording run."""
        with self._lock:
            self._retired += self._groups.pop(group, [])
            if sensors:
                self._groups[group] = list(sensors)
            for sensor in sensors:
                self._owners[id(sensor)] = owner
            self._version += 1
        self._regrouped.set()
        self._wake_writer.set()  # so the tick thread reads the new files without delay
        if self._threads:
            for sensor in sensors:
                if getattr(sensor, "slow", False):
                    self._spawn(f"sampler:{sensor.name}", self._slow_loop, sensor)

    def metadata(self) -> list[dict[str, Any]]:
        """Every sensor's details, the interval it is read at, and which thread reads it."""
        return [{**sensor_details(s), "sample_interval_s": self.interval(s),
                 "reader": self.reader(s)} for s in self.sensors]

    def reader(self, sensor: Sensor) -> str:
        """"tick thread" (C, server/capture.py), "own thread" (slow) or "python tick"."""
        if getattr(sensor, "slow", False):
            return "own thread"
        return "tick thread" if self._captured(sensor) else "python tick"

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn("writer", self._write_loop)
        self._spawn("sampler", self._schedule_loop)
        for sensor in self.sensors:
            if getattr(sensor, "slow", False):
                self._spawn(f"sampler:{sensor.name}", self._slow_loop, sensor)

    def _spawn(self, name: str, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        """Stop reading, write what was read, end the threads, close the sensors."""
        self._stop.set()
        self._active.set()  # wake parked readers so they see the stop
        self._regrouped.set()
        self._wake_writer.set()
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            call_each(self._retired + [s for g in self._groups.values() for s in g], "close")
            self._retired.clear()

    # -- recording -----------------------------------------------------------------------------

    def record(self, run_id: int) -> None:
        """Store samples for a run from now on."""
        with self._lock:
            self._recordings[run_id] = _Recording(time.monotonic_ns())
            self._active.set()
        self._wake_writer.set()  # the writer sleeps without a timeout while nothing records

    def stop_recording(self, run_id: int) -> None:
        """Write what was read for the run so far, then stop storing samples for it."""
        self.flush()
        with self._lock:
            self._recordings.pop(run_id, None)
            if not self._recordings:
                self._active.clear()

    def recording(self) -> list[int]:
        with self._lock:
            return list(self._recordings)

    def flush(self, timeout: float = 10.0) -> None:
        """Return once everything read before this call is committed."""
        with self._written:
            target = self._started + 1  # the first write to start after this call
            self._wake_writer.set()
            self._written.wait_for(
                lambda: self._generation >= target or self._stop.is_set(), timeout
            )

    # -- readers -------------------------------------------------------------------------------

    def _read(self, sensor: Sensor, t_ns: int | None = None) -> None:
        """Read now (stamped with the middle of the read), or decode a tick read at `t_ns`."""
        t0 = time.monotonic_ns() if t_ns is None else t_ns
        try:
            value = sensor.read()
        except Exception:  # the protocol says never; a third-party sensor might
            value = None
            self.errors[sensor.name] = self.errors.get(sensor.name, 0) + 1
        if value is not None:
            t = (t0 + time.monotonic_ns()) // 2 if t_ns is None else t_ns
            self._queue.append((sensor, t, float(value)))

    def _captured(self, sensor: Sensor) -> bool:
        """Whether the tick thread reads this sensor (else a Python thread does)."""
        return self.use_ticker and not getattr(sensor, "slow", False) and capture.capturable(
            sensor)

    def _grid(self, sensors: Sequence[Sensor]) -> tuple[float, list[tuple[int, Sensor]]]:
        """(tick, [(every n ticks, sensor)]): the shortest interval is the tick and each sensor
        is read every ⌊interval / tick⌋ ticks (never less often than it asks)."""
        intervals = [self.interval(s) for s in sensors]
        tick = min(intervals, default=MAX_NAP_S)
        every = [max(1, int(interval / tick + 1e-9)) for interval in intervals]
        return tick, list(zip(every, sensors, strict=True))

    def _schedule_loop(self) -> None:
        """Read the cheap sensors on one grid of ticks. The shortest interval is the tick and
        each sensor is read every ⌊interval / tick⌋ ticks (never less often than it asks), so
        sensors due together share one wake-up: on a VM a wake-up costs ~30 µs, more than any
        read here, and work done right after a rare wake-up runs on cold caches. Ticks are
        absolute (no drift); a late tick is read at once and the missed ones are skipped, never
        made up in a burst. Sleeps last at most `MAX_NAP_S`, so a stop, a pause or a new sensor
        set is noticed within that. The writer is woken from here, not by a timer of its own:
        one wake-up fewer per flush."""
        version = -1
        tick, plan, next_tick = MAX_NAP_S, [], []
        start, k, next_flush = 0.0, 0, 0.0
        clock, sleep, read = time.monotonic, time.sleep, self._read
        while not self._stop.is_set():
            if clock() >= next_flush and not self._writer_keeps_time:
                self._wake_writer.set()
                next_flush = clock() + self.flush_s
            resumed = not self._active.is_set()
            if resumed:
                self._active.wait()
                version = -1  # start afresh: no burst of overdue reads after a pause
            if version != self._version:
                self._regrouped.clear()
                version, tick, plan = self._schedule()
                self._grid_ticking = bool(plan)
                next_tick = [0] * len(plan)
                start, k = clock(), 0
            if resumed:
                call_each((sensor for _, sensor in plan), "restart")
            if not plan:  # all on the tick thread: park until the sensors change
                self._regrouped.wait()
                continue
            delay = start + k * tick - clock()
            if delay > 0:
                sleep(min(delay, MAX_NAP_S))
                if delay > MAX_NAP_S:
                    continue
            for i, (every, sensor) in enumerate(plan):
                if next_tick[i] <= k:
                    read(sensor)
                    next_tick[i] = k + every
            k = max(k + 1, int((clock() - start) / tick))

    def _schedule(self) -> tuple[int, float, list[tuple[int, Sensor]]]:
        """(version, tick, plan) for the cheap sensors this thread reads; closes the retired
        ones (this thread is the one that read them)."""
        def mine(sensor: Sensor) -> bool:
            return not getattr(sensor, "slow", False) and not self._captured(sensor)

        version, fast = self._take_group(mine)
        return version, *self._grid(fast)

    def _take_group(self, mine: Callable[[Sensor], bool]) -> tuple[int, list[Sensor]]:
        """(version, current sensors) of those `mine` selects; closes its retired ones."""
        with self._lock:
            version = self._version
            retired = [s for s in self._retired if mine(s)]
            self._retired = [s for s in self._retired if not mine(s)]
            current = [s for g in self._groups.values() for s in g if mine(s)]
        call_each(retired, "close")
        return version, current

    def _slow_loop(self, sensor: Sensor) -> None:
        interval = self.interval(sensor)
        while not self._stop.is_set():
            self._active.wait()
            with self._lock:
                current = any(sensor is s for g in self._groups.values() for s in g)
                if not current:
                    self._retired.remove(sensor)
            if not current:
                call_each([sensor], "close")
                return
            start = time.monotonic()
            self._read(sensor)
            self._stop.wait(max(0.0, interval - (time.monotonic() - start)))

    # -- writer --------------------------------------------------------------------------------

    def _write_loop(self) -> None:
        ticks: capture.Capture | None = None
        version, lost_before = -1, 0  # records lost by the tick threads this one replaced
        parked = True  # the tick thread does not run: its rate sensors restart when it does
        with Store(self.store_path) as store:
            try:
                while True:
                    self._wake_writer.wait(self._writer_timeout(ticks))
                    self._wake_writer.clear()
                    stopping = self._stop.is_set()
                    with self._written:
                        self._started += 1
                    if ticks is not None:
                        ticks.replay(self._read)
                    if version != self._version and self.use_ticker:
                        if ticks is not None:
                            ticks.close()
                            lost_before += ticks.dropped
                        version, ticks = self._capture_plan()
                        self._writer_keeps_time = ticks is not None
                    lost = lost_before + (ticks.dropped if ticks is not None else 0)
                    if lost:  # the writer was stuck for minutes
                        self.errors["tick buffer"] = lost
                    if ticks is not None:
                        if self._active.is_set() and not stopping:
                            if parked:  # (its sensors are decoded on this thread)
                                call_each((sensor for _, sensor in ticks.plan), "restart")
                            ticks.start()
                        else:
                            ticks.stop()
                        parked = not self._active.is_set() or stopping
                    self._write(store)
                    with self._written:
                        self._generation += 1
                        self._written.notify_all()
                    if stopping:
                        return
            finally:
                if ticks is not None:
                    ticks.close()

    def _writer_timeout(self, ticks: capture.Capture | None) -> float | None:
        """Parked while nothing records; else it wakes itself every flush_s, unless the Python
        scheduler ticks and wakes it (the timeout then only covers a stuck scheduler)."""
        if not self._active.is_set():
            return None
        if ticks is None and self._grid_ticking:
            return 2 * self.flush_s
        return self.flush_s

    def _capture_plan(self) -> tuple[int, capture.Capture | None]:
        """(version, the tick thread's plan) for the sensors it reads now, None without any;
        closes their retired ones (this thread decoded them)."""
        version, sensors = self._take_group(self._captured)
        if not sensors:
            return version, None
        tick, plan = self._grid(sensors)
        return version, capture.Capture(plan, tick)

    def _write(self, store: Store) -> None:
        queue = self._queue
        taken = [queue.popleft() for _ in range(len(queue))]
        with self._lock:
            recordings = list(self._recordings.items())
            owners = dict(self._owners)
        if not taken or not recordings:
            return
        try:
            rows: list[tuple[int, int, float]] = []
            with store.transaction():
                for run_id, rec in recordings:
                    kept = [sample for sample in taken if sample[1] >= rec.since_ns
                            and owners.get(id(sample[0])) in (None, run_id)]
                    sensors = {sensor.name: sensor for sensor, _, _ in kept}
                    ids = {n: self._sensor_id(store, run_id, rec, s) for n, s in sensors.items()}
                    rows += [(ids[sensor.name], t, v) for sensor, t, v in kept]
                store.add_samples(rows)
        except Exception as exc:  # a full disk must not take the server down
            for _, rec in recordings:
                rec.ids.clear()  # ids handed out in the rolled-back transaction are void
            self.errors["store"] = self.errors.get("store", 0) + 1
            print(f"fecomlite server: could not store samples: {exc}", file=sys.stderr)

    @staticmethod
    def _sensor_id(store: Store, run_id: int, rec: _Recording, sensor: Sensor) -> int:
        sensor_id = rec.ids.get(sensor.name)
        if sensor_id is None:
            sensor_id = rec.ids[sensor.name] = store.add_sensor(run_id, **sensor_row(sensor))
        return sensor_id


def call_each(sensors: Iterable[Sensor], method: str) -> None:
    """Call each sensor's optional `method` (`close`; `restart`: rate sensors begin a new
    window, so that none of their values spans a pause), best effort: a sensor that fails is
    reported and never stops its reader."""
    for sensor in sensors:
        call = getattr(sensor, method, None)
        if callable(call):
            try:
                call()
            except Exception as exc:
                print(f"fecomlite server: {method} {sensor.name}: {exc}", file=sys.stderr)
