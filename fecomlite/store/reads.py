"""The store's read queries, by what the rest of fecomlite asks for: samples, events, sites and
runs. The only other place that speaks SQL is the store itself (`fecomlite/store/__init__.py`:
the schema, its versions and the writes); everything else calls these methods by name.

Times are `time.monotonic_ns()`; rows come back as `sqlite3.Row`s, which index and unpack like
tuples (bulk reads feed numpy), or as dicts.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from fecomlite.runtime.batch_codec import CONTINUES
from fecomlite.store import events

if TYPE_CHECKING:
    import numpy as np

_NEVER = 2**63 - 1  # no upper bound on a time
SAMPLE_CHUNK = 65_536  # samples read into numpy at a time
_SAMPLE = [("t", "<i8"), ("v", "<f8")]


class StoreReads:
    """Mixed into `Store`, which opens `db`."""

    db: sqlite3.Connection

    # -- samples ------------------------------------------------------------------------------

    def samples(
        self, sensor_id: int, start_ns: int | None = None, end_ns: int | None = None,
        *, after_start: bool = False,
    ) -> list[tuple[int, float]]:
        """(t_ns, value) of one sensor in time order, from `start_ns` (exclusive with
        `after_start`) to `end_ns` inclusive; the whole series without bounds."""
        low = "t_ns>?" if after_start else "t_ns>=?"
        return self.db.execute(
            f"SELECT t_ns, value FROM samples WHERE sensor_id=? AND {low} AND t_ns<=? "
            "ORDER BY t_ns",
            (sensor_id, -1 if start_ns is None else start_ns,
             _NEVER if end_ns is None else end_ns),
        ).fetchall()

    def sample_arrays(
        self, sensor_id: int, start_ns: int | None = None, *, limit: int | None = None,
        chunk: int = SAMPLE_CHUNK,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(t_ns int64, value float64) of one sensor in time order from `start_ns` (inclusive;
        the first sample without it), at most `limit` samples: read `chunk` rows at a time into
        numpy, never a Python row a sample for the whole series (~10x its bytes)."""
        import numpy as np

        parts = list(self.sample_chunks(sensor_id, start_ns, limit=limit, chunk=chunk))
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0)
        both = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return np.ascontiguousarray(both["t"]), np.ascontiguousarray(both["v"])

    def sample_span(self, sensor_id: int, start_ns: int | None = None,
                    end_ns: int | None = None, *, positive: bool = False
                    ) -> tuple[int, int] | None:
        """(first, last) time of one sensor's samples within [start_ns, end_ns] (with
        `positive`, of those above 0), None without any: two lookups in the samples' index,
        not a read of the series."""
        where = "sensor_id=? AND t_ns>=? AND t_ns<=?" + (" AND value>0" if positive else "")
        args = (sensor_id, -(1 << 63) if start_ns is None else start_ns,
                (1 << 63) - 1 if end_ns is None else end_ns)
        first = self.db.execute(f"SELECT t_ns FROM samples WHERE {where} ORDER BY t_ns LIMIT 1",
                                args).fetchone()
        if first is None:
            return None
        last = self.db.execute(
            f"SELECT t_ns FROM samples WHERE {where} ORDER BY t_ns DESC LIMIT 1", args).fetchone()
        return int(first[0]), int(last[0])

    def sample_chunks(
        self, sensor_id: int, start_ns: int | None = None, *, limit: int | None = None,
        chunk: int = SAMPLE_CHUNK,
    ) -> Iterator[np.ndarray]:
        """One sensor's samples in time order, `chunk` at a time, as numpy records (t: int64 ns,
        v: float64): a pass over a long series (a day of 200 Hz RSS: 17 M samples) in the
        memory of one chunk."""
        import numpy as np

        rows = self.db.cursor()
        rows.row_factory = None  # plain tuples: numpy reads them as records
        rows.execute(
            "SELECT t_ns, value FROM samples WHERE sensor_id=? AND t_ns>=? ORDER BY t_ns LIMIT ?",
            (sensor_id, -1 if start_ns is None else start_ns, -1 if limit is None else limit))
        while batch := rows.fetchmany(chunk):
            yield np.fromiter(batch, _SAMPLE, len(batch))

    def sample_before(self, sensor_id: int, t_ns: int) -> int | None:
        """When the sensor's last sample at or before `t_ns` was taken, None before the first."""
        return self.db.execute(
            "SELECT max(t_ns) FROM samples WHERE sensor_id=? AND t_ns<=?", (sensor_id, t_ns),
        ).fetchone()[0]

    def sample_after(self, sensor_id: int, t_ns: int) -> tuple[int, float] | None:
        """(t_ns, value) of the sensor's first sample at or after `t_ns`, None past the last."""
        row = self.db.execute(
            "SELECT t_ns, value FROM samples WHERE sensor_id=? AND t_ns>=? ORDER BY t_ns "
            "LIMIT 1", (sensor_id, t_ns)).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def last_sample(self, sensor_id: int) -> tuple[int, float] | None:
        """(t_ns, value) of the sensor's newest sample, None without one."""
        row = self.db.execute(
            "SELECT t_ns, value FROM samples WHERE sensor_id=? ORDER BY t_ns DESC LIMIT 1",
            (sensor_id,)).fetchone()
        return None if row is None else (int(row[0]), float(row[1]))

    def max_sample(self, sensor_id: int, start_ns: int, end_ns: int) -> float | None:
        """The largest value one sensor read between two instants (inclusive), or None."""
        return self.db.execute(
            "SELECT max(value) FROM samples WHERE sensor_id=? AND t_ns BETWEEN ? AND ?",
            (sensor_id, start_ns, end_ns),
        ).fetchone()[0]

    def first_sample_ns(self, run_id: int) -> int | None:
        """When the run's earliest sample was taken, any sensor."""
        return self.db.execute(
            "SELECT min(t_ns) FROM samples WHERE sensor_id IN (SELECT id FROM sensors WHERE "
            "run_id=?)", (run_id,),
        ).fetchone()[0]

    def samples_after(self, rowid: int, limit: int) -> list[tuple[int, int, int, float]]:
        """(rowid, sensor_id, t_ns, value) of samples stored after `rowid`, any run, in the
        order stored: what a follower of the live store has not seen yet."""
        return self.db.execute(
            "SELECT rowid, sensor_id, t_ns, value FROM samples WHERE rowid > ? "
            "ORDER BY rowid LIMIT ?", (rowid, limit),
        ).fetchall()

    def sensors_after(self, sensor_id: int) -> list[tuple[Any, ...]]:
        """(id, name, domain, unit, kind, provenance, model) of sensors added after `sensor_id`,
        any run."""
        return self.db.execute(
            "SELECT id, name, domain, unit, kind, provenance, model FROM sensors WHERE id > ? "
            "ORDER BY id", (sensor_id,),
        ).fetchall()

    def sensor_names(self, run_id: int) -> set[str]:
        return {r[0] for r in self.db.execute(
            "SELECT name FROM sensors WHERE run_id=?", (run_id,))}

    # -- events and sites ---------------------------------------------------------------------

    def event_columns(self, run_id: int) -> dict[str, Any]:
        """Every call of the run as numpy columns (`events.COLUMNS`), by repetition then start,
        ties in the order stored; a size not taken is -1."""
        return events.run_columns(self.db, run_id)

    def event_chunks(self, run_id: int) -> Iterator[dict[str, Any]]:
        """The run's calls chunk by chunk (`events.time_ordered`): for streaming consumers, in
        the memory of one chunk."""
        return events.time_ordered(self.db, run_id)

    def event_count(self, run_id: int) -> int:
        return events.count(self.db, run_id)

    def event_rows(self, run_id: int) -> list[tuple[int, ...]]:
        """(rep, site_id, pid, tid, t_start_ns, t_end_ns, status, in_bytes, out_bytes) of every
        call of the run, by repetition then start; a size not taken is -1."""
        cols = self.event_columns(run_id)
        return list(zip(*(cols[c].tolist() for c in events.COLUMNS), strict=True))

    def first_event_ns(self, run_id: int) -> int | None:
        """When the run's earliest call started, without opening a chunk."""
        return events.first_start(self.db, run_id)

    def site_spans(self, run_id: int, key: str) -> list[tuple[int, int]]:
        """(t_start_ns, t_end_ns) of each call of one site (a region), by repetition."""
        row = self.db.execute("SELECT id FROM sites WHERE run_id=? AND key=?",
                              (run_id, key)).fetchone()
        if row is None:
            return []
        cols = self.event_columns(run_id)
        mine = cols["site_id"] == row[0]
        return list(zip(cols["t_start_ns"][mine].tolist(), cols["t_end_ns"][mine].tolist(),
                        strict=True))

    def sites(self, run_id: int) -> list[dict[str, Any]]:
        """The run's call sites, by id."""
        return [dict(r) for r in self.db.execute(
            "SELECT * FROM sites WHERE run_id=? ORDER BY id", (run_id,))]

    def site_apis(self, run_id: int) -> dict[int, str]:
        """site id -> its API."""
        return dict(self.db.execute("SELECT id, api FROM sites WHERE run_id=?", (run_id,)))

    def last_rowid(self, table: str) -> int:
        """The newest row of `events` (its chunks), `samples` or `sensors` (0 when empty):
        where a follower starts."""
        tables = {"events": "event_chunks", "samples": "samples", "sensors": "sensors"}
        if table not in tables:
            raise ValueError(f"not a followed table: {table!r}")
        return int(self.db.execute(
            f"SELECT coalesce(max(rowid), 0) FROM {tables[table]}").fetchone()[0])

    def first_event_rowid(self, run_id: int) -> int | None:
        """The run's first event chunk: a follower of the run starts before it."""
        return self.db.execute(
            "SELECT min(id) FROM event_chunks WHERE run_id=?", (run_id,)).fetchone()[0]

    def _new_events(self, run_id: int, after: int, upto: int) -> dict[str, Any]:
        """The run's events in the chunks stored in (after, upto], in the order stored."""
        import numpy as np

        parts = [cols for _, cols in events.chunks(
            self.db, "id > ? AND id <= ? AND run_id = ?", (after, upto, run_id))]
        if not parts:
            return {c: np.zeros(0, np.int64) for c in events.COLUMNS}
        return {c: np.concatenate([p[c] for p in parts]) for c in events.COLUMNS}

    def new_calls_by_site_and_process(
        self, run_id: int, after: int, upto: int
    ) -> list[tuple[int, int, int, int]]:
        """(site_id, pid, calls, total ns) of the run's events stored in (after, upto] (chunk
        ids); a continuation (a later piece of a call) adds its time, not a call."""
        import numpy as np

        new = self._new_events(run_id, after, upto)
        if not new["site_id"].size:
            return []
        keys, group = distinct_pairs(new["site_id"], new["pid"])
        calls = np.bincount(group, (new["status"] & CONTINUES) == 0, len(keys))
        ns = np.bincount(group, new["t_end_ns"] - new["t_start_ns"], len(keys))
        return [(int(s), int(p), int(c), int(t)) for (s, p), c, t in zip(
            keys, calls, ns, strict=True)]

    def last_new_call(self, run_id: int, after: int, upto: int) -> tuple[int, ...] | None:
        """(site_id, t_start_ns, t_end_ns, status) of the run's newest event in (after, upto]:
        the one that ended last in the newest chunk."""
        row = self.db.execute(
            "SELECT max(id) FROM event_chunks WHERE id > ? AND id <= ? AND run_id = ?",
            (after, upto, run_id)).fetchone()
        if row[0] is None:
            return None
        new = self._new_events(run_id, row[0] - 1, row[0])
        i = len(new["t_end_ns"]) - 1 - int(new["t_end_ns"][::-1].argmax())  # last of ties
        return tuple(int(new[c][i]) for c in ("site_id", "t_start_ns", "t_end_ns", "status"))

    def new_calls_ending_after(
        self, run_id: int, after: int, upto: int, end_ns: int
    ) -> dict[str, Any]:
        """Columns t_start_ns, t_end_ns, pid, tid, site_id of the run's events in (after, upto]
        (chunk ids) that end after `end_ns` (numpy: a follower that comes late may get many)."""
        new = self._new_events(run_id, after, upto)
        late = new["t_end_ns"] > end_ns
        return {c: new[c][late] for c in ("t_start_ns", "t_end_ns", "pid", "tid", "site_id")}

    # -- runs ---------------------------------------------------------------------------------

    def run_ids(
        self, kinds: Sequence[str] | None = None, *, status: str | None = None,
        newest_first: bool = False,
    ) -> list[int]:
        """Ids of the runs of these kinds (any kind: None) and status (any: None)."""
        where, args = ["1"], []
        if kinds is not None:
            where.append(f"kind IN ({','.join('?' * len(kinds))})")
            args += list(kinds)
        if status is not None:
            where.append("status=?")
            args.append(status)
        order = "DESC" if newest_first else "ASC"
        return [int(r[0]) for r in self.db.execute(
            f"SELECT id FROM runs WHERE {' AND '.join(where)} ORDER BY id {order}", args)]

    def latest_method_run(self, program: str, other_than: int) -> int | None:
        """The newest top-level method-level run of `program` but `other_than`."""
        row = self.db.execute(
            "SELECT max(id) FROM runs WHERE program=? AND level='method' AND parent_id IS NULL "
            "AND id<>?", (program, other_than)).fetchone()
        return None if row[0] is None else int(row[0])

    def latest_run_with_result(self, name: str, other_than: int) -> int | None:
        """The newest run but `other_than` that has result `name`."""
        row = self.db.execute(
            "SELECT max(run_id) FROM results WHERE name=? AND run_id<>?", (name, other_than),
        ).fetchone()
        return None if row[0] is None else int(row[0])

    def run_columns(self, run_id: int) -> dict[str, Any]:
        """The run's own columns without its manifest (which may be large), and its
        repetitions' times: what a live view polls."""
        row = self.db.execute(
            "SELECT id, kind, program, argv, level, status, exit_code, settings, idle, "
            "t_start_ns, t_end_ns, created_unix FROM runs WHERE id=?", (run_id,),
        ).fetchone()
        out = dict(row)
        for key in ("argv", "settings", "idle"):
            out[key] = json.loads(out[key])
        out["repetitions"] = [dict(r) for r in self.db.execute(
            "SELECT rep, t_start_ns, t_end_ns, tail_end_ns, exit_code FROM repetitions "
            "WHERE run_id=? ORDER BY rep", (run_id,))]
        return out


def row_codes(*columns: np.ndarray) -> np.ndarray:
    """One int64 per row of several integer columns, equal for equal rows and ordered as the
    rows are (lexicographically), so a 1-D `np.unique` groups rows: `np.unique(..., axis=0)`
    sorts rows as raw bytes, 10-100x slower on a million calls."""
    import numpy as np

    codes = np.zeros(columns[0].size if columns else 0, np.int64)
    for column in columns:
        distinct, index = dense_ranks(column)
        codes = codes * distinct + index
    return codes


def dense_ranks(column: np.ndarray) -> tuple[int, np.ndarray]:
    """(how many distinct values, each value's rank among them): `np.unique(column,
    return_inverse=True)`'s inverse; by a table over the values' range instead of a sort where
    that range is small (site ids, thread codes, repetitions: most of what is grouped)."""
    import numpy as np

    if column.size == 0:
        return 0, np.zeros(0, np.int64)
    if column.dtype.kind in "iub":
        lo, hi = int(column.min()), int(column.max())
        if hi - lo <= 4 * column.size + (1 << 16):
            offset = column.astype(np.int64) - lo
            present = np.zeros(hi - lo + 1, bool)
            present[offset] = True
            rank = np.cumsum(present) - 1
            return int(rank[-1]) + 1, rank[offset]
    few = _few_values(column)
    if few is not None:  # thread ids: a few values far apart
        return few.size, np.searchsorted(few, column).astype(np.int64)
    values, index = np.unique(column, return_inverse=True)
    return values.size, index.reshape(-1).astype(np.int64)


def _few_values(column: np.ndarray, few: int = 8) -> np.ndarray | None:
    """The distinct values of a column that holds at most `few` (sorted), picked out one by
    one, ~10x faster than sorting a million; None for a column of more (its first rows tell,
    before a pass over the rest)."""
    import numpy as np

    head = np.sort(column[:1024])  # not np.unique: it imports numpy.ma (10 ms)
    if int((head[1:] != head[:-1]).sum()) >= few:
        return None
    found = []
    left = column
    while left.size and len(found) < few:
        found.append(left[0])
        left = left[left != left[0]]
    return None if left.size else np.sort(np.array(found, column.dtype))


def distinct_pairs(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct (a, b) pairs, sorted, and each element's pair index (see `row_codes`)."""
    import numpy as np

    ub = np.unique(b)
    codes, which = np.unique(row_codes(a, b), return_inverse=True)
    ua = np.unique(a)
    return np.stack((ua[codes // ub.size], ub[codes % ub.size]), axis=1), which.reshape(-1)
