"""Cheap repeated reads of small kernel files (sysfs, procfs): open once, `pread` at offset 0.

Re-opening a file costs several syscalls and a path walk; `pread` on a kept descriptor is one
syscall, and sysfs/procfs regenerate the content on every read at offset 0.

The server's sampler may read these files on a C thread instead (fecomlite/server/_ticker.c) and
hand
the contents back later: while `replaying(tick)` is active on a thread, a `KernelFile` there
returns what was read at that tick, and `monotonic()` returns when, so a sensor's own read code
decodes a capture exactly as if it were reading now.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

_serials = itertools.count(1)
_replay = threading.local()


@dataclass
class Tick:
    """What was read at one tick: content (or errno) per file key, and the time it was read."""

    t_s: float
    contents: dict[int, bytes | int]


@contextmanager
def replaying(tick: Tick) -> Iterator[Tick]:
    """Serve `tick` to the kernel-file reads and the clock of this thread."""
    _replay.tick = tick
    try:
        yield tick
    finally:
        _replay.tick = None


def monotonic() -> float:
    """time.monotonic(), or the replayed tick's time: for sensors that measure windows."""
    tick = getattr(_replay, "tick", None)
    return time.monotonic() if tick is None else tick.t_s


class KernelFile:
    """One small kernel file kept open for repeated reads; `key` names it to the tick thread."""

    def __init__(self, path: str | os.PathLike[str], size: int = 4096) -> None:
        self.path = os.fspath(path)
        self.size = size
        self.key = next(_serials)
        self.fd = -1
        self.fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)

    def read_bytes(self) -> bytes:
        tick = getattr(_replay, "tick", None)
        if tick is not None:
            content = tick.contents.get(self.key)
            if isinstance(content, bytes):
                return content
            if content is not None:
                raise OSError(content, os.strerror(content), self.path)
            # not read at this tick (opened after the plan was made): read it now
        return os.pread(self.fd, self.size, 0)

    def read_int(self) -> int:
        return int(self.read_bytes())

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


def read_text(path: str | os.PathLike[str]) -> str:
    """A whole small file, stripped; for one-off reads at discovery time."""
    with open(path) as f:
        return f.read().strip()
