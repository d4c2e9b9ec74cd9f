"""Counts a process's recorded events where its death cannot erase them: an 8-byte file mapped
shared.

The probe adds each event it records (one memory write, in C or Python). The file's pages belong
to the kernel's page cache, so the count survives an `os._exit`, a SIGKILL, a SIGSEGV or an OOM
kill. The file is named by the process's batch id (`Sender.proc`), so once the program has ended
the runner reads how many events each process recorded (`recorded_counts`) and the store, which
knows how many of each process's events it holds, counts exactly those that never arrived. One
file per process (`<spool stem>.<proc>.count`, beside the run's spool in its private log folder),
made only inside a `fecomlite run`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import sys
from pathlib import Path

SIZE = 8  # recorded events: one native uint64
_NAME = re.compile(r"\.([0-9a-f]{16})\.count$")


class EventCounter:
    """This process's counter file, mapped (`map`: what the C probe writes through)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self.map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.slots = memoryview(self.map).cast("Q")

    def recorded(self) -> None:
        """One more event recorded (the pure-Python buffer; the C one writes the slot itself)."""
        self.slots[0] += 1


def open_counter(spool: str, proc: str) -> EventCounter | None:
    """The counter of the process whose batches carry `proc`, beside the run's spool; None
    outside a run or when it cannot be made (nothing is counted then, nothing raises)."""
    if not spool:
        return None
    path = Path(spool)
    try:
        return EventCounter(path.with_name(f"{path.stem}.{proc}.count"))
    except (OSError, ValueError):
        return None


def recorded_counts(folder: Path) -> dict[str, int]:
    """proc -> events recorded, for each counter file in `folder`; the files are removed."""
    counts: dict[str, int] = {}
    for path in folder.glob("*.count"):
        name = _NAME.search(path.name)
        with contextlib.suppress(OSError):
            data = path.read_bytes()
            if name and len(data) == SIZE:
                counts[name[1]] = counts.get(name[1], 0) + int.from_bytes(data, sys.byteorder)
        with contextlib.suppress(OSError):
            path.unlink()
    return counts

