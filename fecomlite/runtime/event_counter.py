"""Counts a process's events where its death cannot erase them: a 16-byte file mapped shared.

The probe adds each event it records (one memory write, in C or Python); the sender adds the
events it delivered (posted, spooled, or counted as lost in a batch's `total`). The file is
memory the kernel writes back after an `os._exit`, a SIGKILL, a SIGSEGV or an OOM kill, so once
the program has ended the runner reads, per process, how many recorded events never left it
(`lost_counts`), and removes the files. One file per process (`<spool stem>.<pid>.count`,
beside the run's spool in its private log folder), created only inside a `fecomlite run`.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from pathlib import Path

SIZE = 16  # recorded, delivered: two native uint64
_FORMAT = "=QQ"


class EventCounter:
    """This process's counter file, mapped: `recorded` (slot 0), `delivered` (slot 1)."""

    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SIZE)
            self.map = mmap.mmap(fd, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.slots = memoryview(self.map).cast("Q")

    def recorded(self) -> None:
        """One more event recorded (the pure-Python buffer; the C one writes slot 0 itself)."""
        self.slots[0] += 1

    def delivered(self, n: int) -> None:
        self.slots[1] += n


def open_counter(spool: str) -> EventCounter | None:
    """This process's counter beside the run's spool; None outside a run or when it cannot be
    made (nothing is counted then, and nothing raises into the program)."""
    if not spool:
        return None
    path = Path(spool)
    try:
        return EventCounter(path.with_name(f"{path.stem}.{os.getpid()}.count"))
    except (OSError, ValueError):
        return None


def lost_counts(folder: Path) -> int:
    """Events recorded but never delivered by the processes whose counter files are in
    `folder`; the files are removed."""
    lost = 0
    for path in folder.glob("*.count"):
        with contextlib.suppress(OSError, struct.error):
            recorded, delivered = struct.unpack(_FORMAT, path.read_bytes()[:SIZE])
            lost += max(recorded - delivered, 0)
        with contextlib.suppress(OSError):
            path.unlink()
    return lost
