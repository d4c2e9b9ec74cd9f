"""The store's read queries, by what the rest of fecomlite asks for: samples, events, sites and
runs. The only other place that speaks SQL is the store itself (`fecomlite/store/__init__.py`:
the schema, its versions and the writes); everything else calls these methods by name.

Times are `time.monotonic_ns()`; rows come back as `sqlite3.Row`s, which index and unpack like
tuples (bulk reads feed numpy), or as dicts.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from fecomlite.runtime.batch_codec import CONTINUES

_NEVER = 2**63 - 1  # no upper bound on a time


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

    def event_rows(self, run_id: int) -> list[tuple[int, ...]]:
        """(rep, site_id, pid, tid, t_start_ns, t_end_ns, status, in_bytes, out_bytes) of every
        call of the run, by repetition then start; a size not taken is -1."""
        return self.db.execute(
            "SELECT rep, site_id, pid, tid, t_start_ns, t_end_ns, status, "
            "coalesce(in_bytes, -1), coalesce(out_bytes, -1) "
            "FROM events WHERE run_id=? ORDER BY rep, t_start_ns", (run_id,),
        ).fetchall()

    def calls_with_sites(self, run_id: int) -> list[tuple[Any, ...]]:
        """(rep, pid, tid, t_start_ns, t_end_ns, status, in_bytes, out_bytes, api, key, written,
        kind) of every call of the run, by start."""
        return self.db.execute(
            "SELECT e.rep, e.pid, e.tid, e.t_start_ns, e.t_end_ns, e.status, e.in_bytes, "
            "e.out_bytes, s.api, s.key, s.written, s.kind FROM events e JOIN sites s "
            "ON s.id = e.site_id WHERE e.run_id=? ORDER BY e.t_start_ns", (run_id,),
        ).fetchall()

    def site_spans(self, run_id: int, key: str) -> list[tuple[int, int]]:
        """(t_start_ns, t_end_ns) of each call of one site (a region), by repetition."""
        return self.db.execute(
            "SELECT e.t_start_ns, e.t_end_ns FROM events e JOIN sites s ON s.id = e.site_id "
            "WHERE e.run_id=? AND s.key=? ORDER BY e.rep, e.t_start_ns", (run_id, key),
        ).fetchall()

    def sites(self, run_id: int) -> list[dict[str, Any]]:
        """The run's call sites, by id."""
        return [dict(r) for r in self.db.execute(
            "SELECT * FROM sites WHERE run_id=? ORDER BY id", (run_id,))]

    def site_apis(self, run_id: int) -> dict[int, str]:
        """site id -> its API."""
        return dict(self.db.execute("SELECT id, api FROM sites WHERE run_id=?", (run_id,)))

    def last_rowid(self, table: str) -> int:
        """The newest row of `events`, `samples` or `sensors` (0 when empty): where a follower
        starts."""
        if table not in ("events", "samples", "sensors"):
            raise ValueError(f"not a followed table: {table!r}")
        return int(self.db.execute(f"SELECT coalesce(max(rowid), 0) FROM {table}").fetchone()[0])

    def first_event_rowid(self, run_id: int) -> int | None:
        return self.db.execute(
            "SELECT min(rowid) FROM events WHERE run_id=?", (run_id,)).fetchone()[0]

    # `+run_id`: scan the new rowids, not the run's index
    def new_calls_by_site_and_process(
        self, run_id: int, after: int, upto: int
    ) -> list[tuple[int, int, int, int]]:
        """(site_id, pid, calls, total ns) of the run's events stored in (after, upto] by
        rowid; a continuation (a later piece of a call) adds its time, not a call."""
        return self.db.execute(
            "SELECT site_id, pid, sum((status & ?) = 0), sum(t_end_ns - t_start_ns) FROM events "
            "WHERE rowid > ? AND rowid <= ? AND +run_id = ? GROUP BY site_id, pid",
            (CONTINUES, after, upto, run_id),
        ).fetchall()

    def last_new_call(self, run_id: int, after: int, upto: int) -> tuple[int, ...] | None:
        """(site_id, t_start_ns, t_end_ns, status) of the run's newest event in (after, upto]."""
        return self.db.execute(
            "SELECT site_id, t_start_ns, t_end_ns, status FROM events WHERE rowid > ? "
            "AND rowid <= ? AND +run_id = ? ORDER BY rowid DESC LIMIT 1", (after, upto, run_id),
        ).fetchone()

    def new_calls_ending_after(
        self, run_id: int, after: int, upto: int, end_ns: int
    ) -> list[tuple[int, ...]]:
        """(t_start_ns, t_end_ns, pid, tid, site_id) of the run's events in (after, upto] by
        rowid that end after `end_ns`."""
        return self.db.execute(
            "SELECT t_start_ns, t_end_ns, pid, tid, site_id FROM events WHERE rowid > ? "
            "AND rowid <= ? AND +run_id = ? AND t_end_ns > ?", (after, upto, run_id, end_ns),
        ).fetchall()

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
