"""A process's unsent events where its death cannot erase them: a ring of records in a file
mapped shared, and its site table in a file beside it.

The C probe writes each record into the ring, then moves the ring's end past it (a record that
finds the ring full waits in memory, and is counted in `overflowed`); the flusher marks what it
has posted or spooled (`sent`), and the id of the batch it is sending (`seq`, up to
`batch_end`). The file's pages belong to the kernel's page cache, so after an `os._exit`, a
SIGKILL, a SIGSEGV or an OOM kill the runner reads the records from `sent` to the ring's end
(`recover_unsent`) and spools them as batches with the ids the process would have used: the
store keeps each id once, so a batch stored just before the death is not stored twice. What
cannot be recovered (records past a full ring, kept in memory; the pure-Python probe's, which
only counts) is counted: recorded (ring end + overflowed) − stored = lost
(`recorded_counts`).

Files, beside the run's spool in its private log folder, named by the process's batch id
(`Sender.proc`): `<spool stem>.<proc>.events` (the ring) and `<spool stem>.<proc>.sites` (u32
length + UTF-8 entries: first a JSON header of the batches' fields, then one site key per site
id, appended before any record names it). Made only inside a `fecomlite run`.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import re
import struct
from pathlib import Path
from typing import Any

from fecomlite.runtime import batch_codec

MAGIC = b"FCLRING1"
HEADER_SIZE = 128
RECORD_SIZE = 48  # the C `Record`
CAPACITY = 1 << 17  # records (6 MB of file)
MIN_CAPACITY = 64  # on a disk without room for CAPACITY
_FIELDS = struct.Struct("=8sIIQQQqQII")  # magic .. n_anchors (the C `RingHeader`)
_ANCHORS = struct.Struct("=6q")  # first (tick, ns), anchors[0], anchors[1]
OVERFLOWED_SLOT = 2  # header[16:24] as the 3rd u64: the pure-Python probe counts its records there
CLOCK_TICKS = 1
RECORD = [("t0", "=i8"), ("t1", "=i8"), ("tid", "=u8"), ("in_bytes", "=i8"), ("out_bytes", "=i8"),
          ("site", "=u4"), ("status", "u1"), ("clock", "u1"), ("pad", "V2")]  # the C `Record`
_NAME = re.compile(r"\.([0-9a-f]{16})\.events$")


class EventRing:
    """This process's ring file, mapped (`map`: what the C probe writes through), and its site
    table file (`sites_fd`: the C probe appends to it)."""

    def __init__(self, stem: Path, proc: str, meta: dict[str, Any]) -> None:
        events = stem.with_name(f"{stem.name}.{proc}.events")
        fd = os.open(events, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            capacity = _allocate(fd)
            self.map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.map[: _FIELDS.size] = _FIELDS.pack(MAGIC, RECORD_SIZE, capacity, 0, 0, 0, -1, 0, 0, 0)
        self.header = memoryview(self.map)[:HEADER_SIZE].cast("Q")
        sites = stem.with_name(f"{stem.name}.{proc}.sites")
        self.sites_fd = os.open(sites, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        _write_entry(self.sites_fd, json.dumps({**meta, "proc": proc}).encode())

    def recorded(self) -> None:
        """One more event recorded (the pure-Python buffer; the C one counts itself)."""
        self.header[OVERFLOWED_SLOT] += 1


def _allocate(fd: int) -> int:
    """Gives the ring file its blocks now (a write into a hole of a mapped file on a full disk
    would be a SIGBUS in the user's program): CAPACITY records, else a ring too small to keep
    much that still counts every record; its capacity."""
    for capacity in (CAPACITY, MIN_CAPACITY):
        try:
            os.posix_fallocate(fd, 0, HEADER_SIZE + capacity * RECORD_SIZE)  # sets the size too
            return capacity
        except OSError:
            os.ftruncate(fd, 0)
    raise OSError("no room for the event ring")


def _write_entry(fd: int, data: bytes) -> None:
    os.write(fd, struct.pack("=I", len(data)) + data)


def open_ring(spool: str, proc: str, meta: dict[str, Any]) -> EventRing | None:
    """The ring of the process whose batches carry `proc`, beside the run's spool; None outside
    a run or when it cannot be made (nothing is kept then, nothing raises). `meta`: the fields
    its recovered batches carry (rep, pid, run, store...)."""
    if not spool:
        return None
    try:
        return EventRing(Path(spool).with_suffix(""), proc, meta)
    except (OSError, ValueError):
        return None


def _read_entries(path: Path) -> list[bytes]:
    """The whole entries of a site table (a torn last one is left out)."""
    data, entries, at = path.read_bytes(), [], 0
    while at + 4 <= len(data):
        (length,) = struct.unpack_from("=I", data, at)
        if at + 4 + length > len(data):
            break
        entries.append(data[at + 4: at + 4 + length])
        at += 4 + length
    return entries


class _Ring:
    """A dead process's ring as read back: header fields, anchors, records."""

    def __init__(self, path: Path) -> None:
        data = path.read_bytes()
        (magic, size, self.capacity, _, self.end, self.sent, self.seq,
         self.batch_end, newest, self.n_anchors) = _FIELDS.unpack_from(data)
        if magic != MAGIC or size != RECORD_SIZE or len(data) < HEADER_SIZE + self.capacity * size:
            raise ValueError(f"{path.name} is not a probe's ring")
        anchors = _ANCHORS.unpack_from(data, _FIELDS.size)
        self.first = anchors[0:2]
        self.newest = anchors[2 + 2 * newest: 4 + 2 * newest]
        self.data = data

    def records(self, start: int, stop: int) -> Any:
        """Ring records [start, stop) as a numpy structured array (`RECORD`)."""
        import numpy as np  # the runner's side only: the probe never loads numpy for this

        ring = np.frombuffer(self.data, RECORD, self.capacity, HEADER_SIZE)
        return ring[np.arange(start, stop) % self.capacity]

    def ns(self, values: Any, clocks: Any) -> Any:
        """Stamps in CLOCK_MONOTONIC ns: ticks along the line through the first and the newest
        anchor (a float64 array; NaN for ticks when no two anchors were kept)."""
        import numpy as np

        (t_a, n_a), (t_b, n_b) = self.first, self.newest
        rate = (n_b - n_a) / (t_b - t_a) if self.n_anchors and t_b != t_a else np.nan
        ticks = n_b + (values - t_b).astype(np.float64) * rate
        return np.where(clocks == CLOCK_TICKS, ticks, values.astype(np.float64))


def _batches(ring: _Ring, sites: list[str], meta: dict[str, Any]) -> list[bytes]:
    """The unsent records as spool batches: the one being sent at the death under its own id,
    the rest under the next. Records naming a site the table lacks, or ticks without anchors,
    cannot be stored right: they are left out (and so counted lost)."""
    import numpy as np

    start = ring.sent
    pieces = []
    if ring.batch_end > start:
        pieces.append((ring.seq, start, ring.batch_end))
        start = ring.batch_end
    pieces.append((ring.seq + 1, start, ring.end))
    out = []
    for seq, begin, stop in pieces:
        rows = ring.records(begin, stop)
        t0, t1 = ring.ns(rows["t0"], rows["clock"]), ring.ns(rows["t1"], rows["clock"])
        rows, t0, t1 = (a[(rows["site"] < len(sites)) & ~np.isnan(t0) & ~np.isnan(t1)]
                        for a in (rows, t0, t1))
        if not len(rows):
            continue
        ids, index = np.unique(rows["site"], return_inverse=True)
        columns = (index.astype("<i4").tobytes(), np.rint(t0).astype("<i8").tobytes(),
                   np.rint(t1).astype("<i8").tobytes(), rows["tid"].astype("<u8").tobytes(),
                   rows["status"].astype("u1").tobytes(), rows["in_bytes"].astype("<i8").tobytes(),
                   rows["out_bytes"].astype("<i8").tobytes())
        # no `total`: the store counts what a death lost as recorded − stored (`lost_at_exit`)
        out.append(batch_codec.encode({**meta, "seq": seq}, [sites[i] for i in ids], columns))
    return out


def recover_unsent(folder: Path) -> int:
    """Spools the unsent records of every ring in `folder` (`<ring>.recovered.spool`, ingested
    with the run's other spools); the events recovered. The rings stay for `recorded_counts`."""
    recovered = 0
    for path in folder.glob("*.events"):
        try:
            ring = _Ring(path)
            entries = _read_entries(path.with_suffix(".sites"))
            meta = json.loads(entries[0]) if entries else None
        except (OSError, ValueError):
            continue
        if ring.end == ring.sent or not isinstance(meta, dict):
            continue
        sites = [entry.decode("utf-8", "replace") for entry in entries[1:]]
        batches = _batches(ring, sites, meta)
        spool = path.with_name(path.name + ".recovered.spool")
        with contextlib.suppress(OSError), spool.open("wb") as out:
            os.chmod(spool, 0o600)
            for batch in batches:
                batch_codec.write_record(out, batch)
            recovered += sum(batch_codec.header_of(b)["n"] for b in batches)
    return recovered


def recorded_counts(folder: Path) -> dict[str, int]:
    """proc -> events recorded, for each ring in `folder`; the rings and site tables are
    removed."""
    counts: dict[str, int] = {}
    for path in folder.glob("*.events"):
        name = _NAME.search(path.name)
        with contextlib.suppress(OSError), path.open("rb") as ring:
            fields = ring.read(_FIELDS.size)
            if name and len(fields) == _FIELDS.size and fields[:8] == MAGIC:
                overflowed, ring_end = _FIELDS.unpack(fields)[3:5]
                counts[name[1]] = counts.get(name[1], 0) + overflowed + ring_end
        for gone in (path, path.with_suffix(".sites")):
            with contextlib.suppress(OSError):
                gone.unlink()
    return counts
