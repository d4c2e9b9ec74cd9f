"""A process's unsent events where its death cannot erase them: a ring of records in a file
mapped shared, and its site table in a file beside it.

The C probe writes each record into the ring, then moves the ring's end past it, and counts it
(`recorded`); the flusher marks what it has posted or spooled (`sent`), and the id of the batch
it is sending (`seq`, up to `batch_end`). The file's pages belong to the kernel's page cache, so
after an `os._exit`, a SIGKILL, a SIGSEGV or an OOM kill the runner reads the records from `sent`
to the ring's end (`recover_unsent`) and spools them as batches with the ids the process would
have used: the store keeps each id once, so a batch stored just before the death is not stored
twice. What cannot be recovered (records past a full ring, kept in memory; the pure-Python
probe's, which only counts) is counted: recorded − stored = lost (`recorded_counts`).

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
CAPACITY = 1 << 17  # records (6 MB of file, its pages made as they are written)
_FIELDS = struct.Struct("=8sIIQQQqQII")  # magic .. n_anchors (the C `RingHeader`)
_ANCHORS = struct.Struct("=6q")  # first (tick, ns), anchors[0], anchors[1]
RECORDED_SLOT = 2  # header[16:24] as the 3rd u64: the count the pure-Python probe keeps
CLOCK_TICKS = 1
_NAME = re.compile(r"\.([0-9a-f]{16})\.events$")


class EventRing:
    """This process's ring file, mapped (`map`: what the C probe writes through), and its site
    table file (`sites_fd`: the C probe appends to it)."""

    def __init__(self, stem: Path, proc: str, meta: dict[str, Any]) -> None:
        events = stem.with_name(f"{stem.name}.{proc}.events")
        fd = os.open(events, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, HEADER_SIZE + CAPACITY * RECORD_SIZE)
            self.map = mmap.mmap(fd, 0, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.map[: _FIELDS.size] = _FIELDS.pack(MAGIC, RECORD_SIZE, CAPACITY, 0, 0, 0, -1, 0, 0, 0)
        self.header = memoryview(self.map)[:HEADER_SIZE].cast("Q")
        sites = stem.with_name(f"{stem.name}.{proc}.sites")
        self.sites_fd = os.open(sites, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        _write_entry(self.sites_fd, json.dumps({**meta, "proc": proc}).encode())

    def recorded(self) -> None:
        """One more event recorded (the pure-Python buffer; the C one counts itself)."""
        self.header[RECORDED_SLOT] += 1


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
        (magic, size, self.capacity, self.recorded, self.end, self.sent, self.seq,
         self.batch_end, newest, self.n_anchors) = _FIELDS.unpack_from(data)
        if magic != MAGIC or size != RECORD_SIZE or len(data) < HEADER_SIZE + self.capacity * size:
            raise ValueError(f"{path.name} is not a probe's ring")
        anchors = _ANCHORS.unpack_from(data, _FIELDS.size)
        self.first = anchors[0:2]
        self.newest = anchors[2 + 2 * newest: 4 + 2 * newest]
        self.data = data

    def records(self, start: int, stop: int) -> list[tuple[int, ...]]:
        """(t0, t1, tid, in_bytes, out_bytes, site, status, clock) of ring records [start, stop)."""
        unpack = struct.Struct("=qqQqqIBB2x").unpack_from
        return [unpack(self.data, HEADER_SIZE + (i % self.capacity) * RECORD_SIZE)
                for i in range(start, stop)]

    def ns(self, value: int, clock: int) -> int | None:
        """A stamp in CLOCK_MONOTONIC ns: ticks along the line through the first and the newest
        anchor; None when no anchor was kept."""
        if clock != CLOCK_TICKS:
            return value
        (t_a, n_a), (t_b, n_b) = self.first, self.newest
        if not self.n_anchors or t_b == t_a:
            return None
        return n_b + round((value - t_b) * (n_b - n_a) / (t_b - t_a))


def _batches(ring: _Ring, sites: list[str], meta: dict[str, Any]) -> list[bytes]:
    """The unsent records as spool batches: the one being sent at the death under its own id,
    the rest under the next."""
    start = ring.sent
    pieces = []
    if ring.batch_end > start:
        pieces.append((ring.seq, start, ring.batch_end))
        start = ring.batch_end
    pieces.append((ring.seq + 1, start, ring.end))
    out = []
    for seq, begin, stop in pieces:
        rows = [r for r in ring.records(begin, stop) if r[5] < len(sites)]
        stamps = [(ring.ns(r[0], r[7]), ring.ns(r[1], r[7])) for r in rows]
        kept = [(r, s) for r, s in zip(rows, stamps, strict=True) if None not in s]
        if not kept:
            continue
        names = list(dict.fromkeys(sites[r[5]] for r, _ in kept))
        index = {name: i for i, name in enumerate(names)}
        columns = (
            struct.pack(f"<{len(kept)}i", *(index[sites[r[5]]] for r, _ in kept)),
            struct.pack(f"<{len(kept)}q", *(s[0] for _, s in kept)),
            struct.pack(f"<{len(kept)}q", *(s[1] for _, s in kept)),
            struct.pack(f"<{len(kept)}Q", *(r[2] for r, _ in kept)),
            bytes(r[6] for r, _ in kept),
            struct.pack(f"<{len(kept)}q", *(r[3] for r, _ in kept)),
            struct.pack(f"<{len(kept)}q", *(r[4] for r, _ in kept)),
        )
        # no `total`: the store counts what a death lost as recorded − stored (`lost_at_exit`)
        out.append(batch_codec.encode({**meta, "seq": seq}, names, columns))
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
                counts[name[1]] = counts.get(name[1], 0) + _FIELDS.unpack(fields)[3]
        for gone in (path, path.with_suffix(".sites")):
            with contextlib.suppress(OSError):
                gone.unlink()
    return counts
