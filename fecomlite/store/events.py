"""Call events kept as compressed column chunks: one SQLite row per stored batch, not per call.

Why: one row (+ index entry) per call cost ≈ 57 bytes and a Python tuple per call on every read,
so a day of training (~90 M calls) needed ~5 GB on disk and tens of GB to report. A chunk holds
one batch's events of one (run, repetition, process), sorted by start, as columns: start deltas,
durations, site ids, thread numbers (into the chunk's own thread table), status bits and sizes,
each byte-shuffled (the high bytes of small numbers become long runs of zeros) and compressed
together with zlib. Measured figures and the alternatives weighed: docs/storage.md.

A chunk's row id is the follower's cursor (the live view reads the chunks stored after it). Reads
give numpy columns; the order of a whole run's events is the old rows' order: by repetition, then
start, ties in the order stored.
"""

from __future__ import annotations

import sqlite3
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # numpy is loaded by the first read or write, not with the store (CLI help)
    import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS event_chunks (
    id INTEGER PRIMARY KEY,              -- in the order stored: a follower's cursor
    run_id INTEGER NOT NULL REFERENCES runs(id),
    rep INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    n INTEGER NOT NULL,                  -- events in the chunk
    t_first_ns INTEGER NOT NULL,         -- earliest start
    t_last_ns INTEGER NOT NULL,          -- latest end
    codec INTEGER NOT NULL,              -- CODEC
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS event_chunks_by_run ON event_chunks (run_id, rep, t_first_ns);
"""
CODECS = (1, 2)  # what this fecomlite reads; it writes CODEC
CODEC = 2  # byte planes: constant ones named, noise kept raw, the rest zlib; sizes sparse
LEVEL = 1  # zlib's fastest: ~9 % larger than level 6, encodes faster (docs/storage.md)
NOISE_BITS = 7.5  # a plane with more entropy a byte than this is stored as it is: zlib would
# spend ~13 ns a byte on it to save under 6 % (the low bytes of times and durations)
NOISE_MIN = 1024  # planes shorter than this are compressed whatever they hold
MIGRATE_CHUNK = 65_536  # events per chunk when rows of an older store are converted

# A chunk's columns after the thread table: name, dtype as stored
_STORED = (
    ("d_start", "<i8"), ("duration", "<i8"), ("site_id", "<i4"), ("thread", "<i4"),
    ("status", "u1"), ("in_bytes", "<i8"), ("out_bytes", "<i8"),
)
_DENSE = _STORED[:5]  # codec 2: sizes are kept apart, for the few events that took them
_SIZES = (("position", "<i8"), ("in_bytes", "<i8"), ("out_bytes", "<i8"))
_ROW_COLUMNS = ("site_id", "tid", "t_start_ns", "t_end_ns", "status", "in_bytes", "out_bytes")
# What reads return, in the order of the old rows (`event_rows`)
COLUMNS = ("rep", "site_id", "pid", "tid", "t_start_ns", "t_end_ns", "status", "in_bytes",
           "out_bytes")


@dataclass(frozen=True)
class Encoded:
    """One chunk ready to be stored: its events' count, earliest start, latest end and blob.
    Made outside the store's transaction, so that compressing (zlib lets go of the GIL) runs
    beside other batches' work instead of holding the write lock."""

    n: int
    t_first: int
    t_last: int
    blob: bytes


def encode(columns: dict[str, np.ndarray]) -> Encoded:
    """A chunk of events given as columns site_id, tid, t_start_ns, t_end_ns, status, in_bytes,
    out_bytes (-1: not taken). Codec 2: each column's byte planes (its values' bytes regrouped
    by significance) that hold one byte throughout (the zero high bytes of small numbers) are
    named, not stored; planes of noise (the low bytes of times) are stored as they are; sizes are
    stored for the events that took one; zlib compresses the rest. zlib then reads ~4 of the 41
    bytes an event holds. The blob: u32 length of the zlib part, the zlib part, the raw planes."""
    import numpy as np

    start = np.asarray(columns["t_start_ns"], np.int64)
    order = np.argsort(start, kind="stable")
    start = start[order]
    end = np.asarray(columns["t_end_ns"], np.int64)[order]
    tids, thread = _threads(np.asarray(columns["tid"]).astype(np.uint64)[order])
    n = int(start.size)
    t_first = int(start[0]) if n else 0
    dense = {
        "d_start": np.diff(start, prepend=t_first), "duration": end - start,
        "site_id": np.asarray(columns["site_id"])[order], "thread": thread,
        "status": np.asarray(columns["status"])[order],
    }
    in_bytes = np.asarray(columns["in_bytes"], np.int64)[order]
    out_bytes = np.asarray(columns["out_bytes"], np.int64)[order]
    taken = np.flatnonzero((in_bytes != -1) | (out_bytes != -1))
    raw: list[bytes] = []
    parts = [struct.pack("<I", tids.size), tids.astype("<u8").tobytes()]
    parts += [_planes(dense[name].astype(dtype, copy=False), raw) for name, dtype in _DENSE]
    parts.append(struct.pack("<I", taken.size))
    parts += [_planes(values.astype("<i8", copy=False), raw)
              for values in (taken, in_bytes[taken], out_bytes[taken])]
    packed = zlib.compress(b"".join(parts), LEVEL)
    t_last = int(end.max()) if n else 0
    return Encoded(n, t_first, t_last, struct.pack("<I", len(packed)) + packed + b"".join(raw))


def _threads(tid: np.ndarray, few: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct thread ids, each event's index into them). A batch holds a few threads: they
    are picked out one by one, a sort (`np.unique`) only past `few` of them."""
    import numpy as np

    found: list[int] = []
    thread = np.zeros(tid.size, np.int64)
    left = tid
    where = np.arange(tid.size)
    while left.size and len(found) < few:
        mine = left == left[0]
        found.append(int(left[0]))
        thread[where[mine]] = len(found) - 1
        left, where = left[~mine], where[~mine]
    if left.size:
        tids, inverse = np.unique(tid, return_inverse=True)
        return tids, inverse.reshape(-1)
    return np.array(found, np.uint64), thread


def decode(n: int, t_first: int, blob: bytes, codec: int = CODEC) -> dict[str, np.ndarray]:
    """The columns of one chunk (site_id, tid, t_start_ns, t_end_ns, status, in_bytes,
    out_bytes), by start."""
    import numpy as np

    if codec == 1:
        raw, noise = zlib.decompress(blob), memoryview(b"")
    else:
        (packed,) = struct.unpack_from("<I", blob)
        raw, noise = zlib.decompress(blob[4:4 + packed]), memoryview(blob)[4 + packed:]
    (k,) = struct.unpack_from("<I", raw)
    tids = np.frombuffer(raw, "<u8", k, 4)
    offset, stored = 4 + 8 * k, {}
    if codec == 1:
        for name, dtype in _STORED:
            size = np.dtype(dtype).itemsize * n
            stored[name] = _unshuffle(raw[offset:offset + size], dtype, n)
            offset += size
    else:
        at = [offset, 0]  # in the zlib part, in the raw planes
        for name, dtype in _DENSE:
            stored[name] = _unplanes(raw, noise, at, dtype, n)
        (m,) = struct.unpack_from("<I", raw, at[0])
        at[0] += 4
        sparse = {}
        for name, dtype in _SIZES:
            sparse[name] = _unplanes(raw, noise, at, dtype, m)
        for name in ("in_bytes", "out_bytes"):
            stored[name] = np.full(n, -1, np.int64)
            stored[name][sparse["position"]] = sparse[name]
    start = t_first + np.cumsum(stored["d_start"])
    return {
        "site_id": stored["site_id"].astype(np.int64),
        "tid": tids.view(np.int64)[stored["thread"]],  # signed, as SQLite kept them
        "t_start_ns": start, "t_end_ns": start + stored["duration"],
        "status": stored["status"].astype(np.int64),
        "in_bytes": stored["in_bytes"], "out_bytes": stored["out_bytes"],
    }


def _planes(values: np.ndarray, noise: list[bytes]) -> bytes:
    """Codec 2's form of one column: a bit mask of the byte planes stored, a bit mask of those
    stored raw (appended to `noise`), every plane's first byte (the whole of a plane not
    stored), then the other stored planes one after another (for zlib)."""
    import numpy as np

    width = values.itemsize
    if not values.size:
        return bytes(2 + width)
    unsigned = values.view(f"u{width}")
    varies = int(np.bitwise_or.reduce(unsigned ^ unsigned[0]))  # bits that differ anywhere
    kept = [p for p in range(width) if varies >> 8 * p & 0xFF]
    grid = values.view(np.uint8).reshape(values.size, width)
    planes = grid.T[kept]
    noisy = _noisy(planes)
    noise.extend(planes[i].tobytes() for i in noisy)
    quiet = [i for i in range(len(kept)) if i not in noisy]
    return (bytes((sum(1 << p for p in kept), sum(1 << kept[i] for i in noisy)))
            + grid[0].tobytes() + planes[quiet].tobytes())


def _noisy(planes: np.ndarray) -> list[int]:
    """The rows of `planes` (k byte planes of n) whose bytes are close to random (Shannon
    entropy ≥ NOISE_BITS), all counted in one pass; none for short planes (a few events)."""
    import numpy as np

    k, n = planes.shape
    if not k or n < NOISE_MIN:
        return []
    counts = np.bincount((planes + (256 * np.arange(k, dtype=np.int64))[:, None]).ravel(),
                         minlength=256 * k).reshape(k, 256) / n
    bits = -(counts * np.log2(counts, out=np.zeros_like(counts), where=counts > 0)).sum(axis=1)
    return [int(i) for i in np.flatnonzero(bits >= NOISE_BITS)]


def _unplanes(raw: bytes, noise: memoryview, at: list[int], dtype: str, n: int) -> np.ndarray:
    """One column stored by `_planes`: its head and quiet planes at at[0] in the zlib part, its
    raw planes at at[1] in `noise`; both offsets are moved past it."""
    import numpy as np

    width = np.dtype(dtype).itemsize
    offset = at[0]
    mask, raw_mask = raw[offset], raw[offset + 1]
    first = np.frombuffer(raw, np.uint8, width, offset + 2)
    offset += 2 + width
    grid = np.empty((width, n), np.uint8)
    grid[:] = first[:, None]
    for p in range(width):
        if raw_mask >> p & 1:
            grid[p] = np.frombuffer(noise, np.uint8, n, at[1])
            at[1] += n
        elif mask >> p & 1:
            grid[p] = np.frombuffer(raw, np.uint8, n, offset)
            offset += n
    at[0] = offset
    return grid.T.copy().view(dtype).reshape(n)


def _unshuffle(planes: bytes, dtype: str, n: int) -> np.ndarray:
    """Codec 1's form of one column: every byte plane, one after another."""
    import numpy as np

    width = np.dtype(dtype).itemsize
    return np.frombuffer(planes, np.uint8).reshape(width, n).T.copy().view(dtype).reshape(n)


def write(db: sqlite3.Connection, run_id: int, rep: int, pid: int,
          columns: dict[str, np.ndarray]) -> int:
    """Store one batch's events of one process as a chunk (inside the caller's transaction);
    returns how many."""
    return put(db, run_id, rep, pid, encode(columns))


def put(db: sqlite3.Connection, run_id: int, rep: int, pid: int, chunk: Encoded) -> int:
    """Store a chunk encoded before (inside the caller's transaction); returns how many events."""
    if chunk.n:
        db.execute(
            "INSERT INTO event_chunks (run_id, rep, pid, n, t_first_ns, t_last_ns, codec, data) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, rep, pid, chunk.n, chunk.t_first, chunk.t_last, CODEC, chunk.blob))
    return chunk.n


def _chunk_rows(db: sqlite3.Connection, where: str, args: tuple[Any, ...],
                order: str = "id") -> Iterator[tuple[Any, ...]]:
    """(id, rep, pid, n, t_first_ns, codec, data) of the chunks `where` selects."""
    return db.execute(
        f"SELECT id, rep, pid, n, t_first_ns, codec, data FROM event_chunks WHERE {where} "
        f"ORDER BY {order}", args)


def _decoded(row: tuple[Any, ...]) -> dict[str, np.ndarray]:
    """One chunk row's columns, with its rep and pid."""
    import numpy as np

    cid, rep, pid, n, t_first, codec, blob = row
    if codec not in CODECS:
        raise ValueError(f"event chunk {cid} has codec {codec}, this fecomlite reads "
                         f"{' and '.join(map(str, CODECS))}")
    cols = decode(n, t_first, blob, codec)
    cols["rep"] = np.full(n, rep, np.int64)
    cols["pid"] = np.full(n, pid, np.int64)
    return cols


def chunks(db: sqlite3.Connection, where: str, args: tuple[Any, ...],
           order: str = "id") -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(chunk id, columns with rep and pid) of the chunks `where` selects, one at a time."""
    for row in _chunk_rows(db, where, args, order):
        yield row[0], _decoded(row)


def run_columns(db: sqlite3.Connection, run_id: int, *,
                by_rep: bool = True) -> dict[str, np.ndarray]:
    """Every event of a run as columns (COLUMNS), by repetition (unless not `by_rep`) then start,
    ties in the order stored. Each chunk is decoded into its place in columns made once, and
    only the events out of that order move: a run's columns are written once, not three times
    (fresh memory is much of the cost of reading a million calls)."""
    import numpy as np

    rows = list(_chunk_rows(db, "run_id=?", (run_id,)))  # compressed: a few bytes a call
    out: dict[str, np.ndarray] = {}
    at = 0
    for row in rows:
        cols = _decoded(row)
        if not out:
            out = {c: np.empty(sum(r[3] for r in rows), cols[c].dtype) for c in COLUMNS}
        for c in COLUMNS:
            out[c][at:at + row[3]] = cols[c]
        at += row[3]
    if not out:
        return {c: np.zeros(0, np.int64) for c in COLUMNS}
    _in_start_order(out, by_rep)
    return out


def _in_start_order(out: dict[str, np.ndarray], by_rep: bool) -> None:
    """Sort the columns in place by (rep,) start, stably; the events of a run come nearly in
    that order, so only those out of it are moved."""
    import numpy as np

    start, rep = out["t_start_ns"], out["rep"]
    later = start[1:] >= start[:-1]
    if by_rep:
        later = (rep[1:] > rep[:-1]) | ((rep[1:] == rep[:-1]) & later)
    if later.all():
        return
    order = np.lexsort((start, rep) if by_rep else (start,))  # stable: ties keep the order
    moved = np.flatnonzero(order != np.arange(order.size))
    source = order[moved]
    for c in COLUMNS:
        out[c][moved] = out[c][source]


def time_ordered(db: sqlite3.Connection, run_id: int) -> Iterator[dict[str, np.ndarray]]:
    """A run's events chunk by chunk, for streaming consumers: chunks by repetition and earliest
    start, each by start; memory is one chunk's. Chunks of different processes or batches may
    overlap in time, but every event of a later chunk of the repetition starts at or after this
    chunk's first start: a sweep over time has seen every event that starts before it."""
    for _, cols in chunks(db, "run_id=?", (run_id,), order="rep, t_first_ns, id"):
        yield cols


def first_start(db: sqlite3.Connection, run_id: int) -> int | None:
    """The earliest start of a run's events (each chunk keeps its own), None without events."""
    first = db.execute("SELECT min(t_first_ns) FROM event_chunks WHERE run_id=?",
                       (run_id,)).fetchone()[0]
    return None if first is None else int(first)


def count(db: sqlite3.Connection, run_id: int) -> int:
    """How many events the run holds, without opening a chunk."""
    return int(db.execute("SELECT coalesce(sum(n), 0) FROM event_chunks WHERE run_id=?",
                          (run_id,)).fetchone()[0])


def copy_run(src: sqlite3.Connection, dst: sqlite3.Connection, src_run: int, dst_run: int,
             site_map: dict[int, int], pid_base: int, shift_ns: int) -> None:
    """Copy a run's chunks into another store (a distributed job's merge): site ids mapped,
    pids moved by `pid_base`, times by `shift_ns`."""
    import numpy as np

    lookup = np.zeros(max(site_map, default=0) + 1, np.int64)
    lookup[list(site_map)] = list(site_map.values())
    for _, cols in chunks(src, "run_id=?", (src_run,)):
        cols["site_id"] = lookup[cols["site_id"]]
        cols["t_start_ns"] = cols["t_start_ns"] + shift_ns
        cols["t_end_ns"] = cols["t_end_ns"] + shift_ns
        write(dst, dst_run, int(cols["rep"][0]), pid_base + int(cols["pid"][0]), cols)


def has_rows(db: sqlite3.Connection) -> bool:
    """Whether the store still holds the one-row-per-call `events` table of schema ≤ 2."""
    return db.execute(
        "SELECT 1 FROM sqlite_master WHERE type='table' AND name='events'").fetchone() is not None


def convert_rows(db: sqlite3.Connection) -> int:
    """Move schema ≤ 2's event rows into chunks (inside the caller's transaction) and drop the
    table; returns how many events moved."""
    import numpy as np

    moved = 0
    groups = db.execute("SELECT DISTINCT run_id, rep, pid FROM events").fetchall()
    for run_id, rep, pid in groups:
        rows = db.execute(
            "SELECT site_id, tid, t_start_ns, t_end_ns, status, coalesce(in_bytes, -1), "
            "coalesce(out_bytes, -1) FROM events WHERE run_id=? AND rep=? AND pid=? "
            "ORDER BY rowid", (run_id, rep, pid))
        while batch := rows.fetchmany(MIGRATE_CHUNK):
            arr = np.array([tuple(r) for r in batch], np.int64)
            cols = dict(zip(_ROW_COLUMNS, arr.T, strict=True))
            moved += write(db, run_id, rep, pid, cols)
    db.execute("DROP TABLE events")
    return moved


def site_ids_of(index: np.ndarray, ids: list[int]) -> np.ndarray:
    """A batch's site column (indexes into its header's sites) as the store's site ids."""
    import numpy as np

    return np.array(ids, np.int64)[index] if ids else np.zeros(len(index), np.int64)
