"""The sensors whose reads are kernel-file reads, read by a C thread and decoded in batches.

A Python thread that wakes at 200 Hz was most of the server's CPU while recording: on a VM each
wake-up costs ~35 µs and the interpreter then runs on cold caches. Here the tick thread
(fecomlite/server/_ticker.c) does the waking and the `pread`s without the GIL, and the sampler's
writer
drains what it read a few times a second and runs each sensor's own `read()` on it, tick by
tick, with the files and the clock showing that tick (sensors/_files.py `replaying`). So a value
is the one the sensor would have read at that moment, stamped with that moment (the middle of
the tick's reads, which take microseconds).

A sensor is read at a tick when one of its files was read there; a file is read as often as the
most frequent sensor that uses it. A file a sensor opened since the plan was made (a new child
process) is read live until the batch ends, and the plan is renewed after each batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fecomlite.sensors._files import Tick, replaying
from fecomlite.sensors.base import Sensor

try:
    from fecomlite.server._ticker import Ticker
except ImportError:  # built without a C compiler: the sampler reads everything in Python
    Ticker = None

AVAILABLE = Ticker is not None


def capturable(sensor: Sensor) -> bool:
    """Whether the tick thread can read this sensor's files (it lists them, and the C part is
    built)."""
    return AVAILABLE and callable(getattr(sensor, "kernel_files", None))


class Capture:
    """`every` and sensor pairs (read every n ticks of `tick_s`), in the order they are read."""

    def __init__(self, plan: Sequence[tuple[int, Sensor]], tick_s: float) -> None:
        if Ticker is None:
            raise RuntimeError("fecomlite.server._ticker is not built")
        self.plan = list(plan)
        self._ticker = Ticker(round(tick_s * 1e9))
        self._entries: list[tuple[int, int, int, int]] = []
        self._keys: list[tuple[Sensor, frozenset[int]]] = []
        self.replan()

    @property
    def dropped(self) -> int:
        """Records the tick thread lost to a full buffer (nobody drained it for minutes)."""
        return self._ticker.dropped

    def replan(self) -> None:
        """Give the tick thread the files the sensors read now (if they changed)."""
        every_of: dict[int, int] = {}
        file_of: dict[int, tuple[int, int]] = {}  # key -> (fd, size)
        self._keys = []
        for every, sensor in self.plan:
            keys = []
            for f in sensor.kernel_files():  # type: ignore[attr-defined]
                if f.fd < 0:
                    continue
                keys.append(f.key)
                every_of[f.key] = min(every, every_of.get(f.key, every))
                file_of[f.key] = (f.fd, f.size)
            self._keys.append((sensor, frozenset(keys)))
        entries = [(key, fd, every_of[key], size) for key, (fd, size) in file_of.items()]
        if entries != self._entries:
            self._ticker.set_plan(entries)
            self._entries = entries

    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def replay(self, read: Callable[[Sensor, int], None]) -> int:
        """Decode everything read since the last call: `read(sensor, t_ns)` for each sensor due
        at each tick, in tick order, with that tick replayed. Returns the ticks replayed."""
        ticks = self._ticker.drain()
        due_for: dict[tuple[int, ...], list[Sensor]] = {}  # a tick's files -> sensors due
        tick = Tick(0.0, {})
        with replaying(tick):
            for t_ns, contents in ticks:
                read_now = tuple(contents)  # a few patterns: the 200 Hz files, then all
                due = due_for.get(read_now)
                if due is None:
                    due = due_for[read_now] = [s for s, keys in self._keys
                                               if not keys.isdisjoint(read_now)]
                tick.t_s, tick.contents = t_ns / 1e9, contents
                for sensor in due:
                    read(sensor, t_ns)
        self.replan()
        return len(ticks)

    def close(self) -> None:
        """Stop the tick thread (its own descriptors close with it)."""
        self._ticker.stop()
        self._ticker.set_plan([])
