"""Tests' view of stored call events: a temporary `events` table (one row per call, the schema
before chunks) to query with SQL, and plain calls to store."""

from __future__ import annotations

from typing import Any

import numpy as np

from fecomlite.store import Store, events


def events_table(store: Store) -> Store:
    """(Re)make TEMP table `events` (run_id, rep, site_id, pid, tid, t_start_ns, t_end_ns,
    status, in_bytes, out_bytes; a size not taken is NULL) from every run's chunks."""
    db = store.db
    db.execute("DROP TABLE IF EXISTS temp.events")
    db.execute("CREATE TEMP TABLE events (run_id, rep, site_id, pid, tid, t_start_ns, "
               "t_end_ns, status, in_bytes, out_bytes)")
    for (run_id,) in db.execute("SELECT DISTINCT run_id FROM event_chunks").fetchall():
        cols = events.run_columns(db, run_id)
        sizes = [[None if v < 0 else v for v in cols[c].tolist()]
                 for c in ("in_bytes", "out_bytes")]
        db.executemany(
            f"INSERT INTO temp.events VALUES ({run_id}, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            zip(*(cols[c].tolist() for c in events.COLUMNS[:7]), *sizes, strict=True))
    return store


def plain_calls(site_ids: Any, t_start: Any, t_end: Any, tid: int = 1) -> dict[str, Any]:
    """Columns of calls that returned, on one thread, sizes not taken: for `Store.add_events`."""
    n = len(site_ids)
    return {"site_id": np.asarray(site_ids, np.int64), "tid": np.full(n, tid, np.int64),
            "t_start_ns": np.asarray(t_start, np.int64), "t_end_ns": np.asarray(t_end, np.int64),
            "status": np.zeros(n, np.int64), "in_bytes": np.full(n, -1, np.int64),
            "out_bytes": np.full(n, -1, np.int64)}
