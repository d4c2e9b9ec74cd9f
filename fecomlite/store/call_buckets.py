"""Calls folded past a run's detail window (`fecomlite run --keep`): per-site time buckets with
counts, sums and sums of squares, in place of the chunks they came from.

Why: a day of training makes ~90 M calls; kept call by call that is ~0.5 GB of store even at
~5.6 B a call. With `--keep` the server folds the calls outside the detail window as the run goes
(`fecomlite/server/folding.py`): one row per (repetition, process, thread, site, bucket) holds
what the attribution needs of them (`fecomlite/analysis/call_buckets.py`), so the store grows
with the run's length over the bucket width, not with its calls. docs/storage.md says what is
kept and how precise the figures from buckets are.

A bucket is [t0_ns, t0_ns + width): calls fall in the bucket of their start. Its `top_*`
figures are of the calls with no folded parent (their parent, if any, was kept in detail: a
chunk holding a call as long as a bucket is never folded), for the analysis to find it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fecomlite.store import events

if TYPE_CHECKING:
    import numpy as np

SCHEMA = """
CREATE TABLE IF NOT EXISTS call_buckets (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    rep INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    tid INTEGER NOT NULL,
    site_id INTEGER NOT NULL,
    t0_ns INTEGER NOT NULL,              -- the bucket's start: a multiple of its width
    width_ns INTEGER NOT NULL,
    calls INTEGER NOT NULL,              -- calls started in it (layer pieces: heads)
    pieces INTEGER NOT NULL,             -- events (a call recorded in pieces counts each)
    raised INTEGER NOT NULL,
    time_ns INTEGER NOT NULL,            -- sum of durations
    time_sq REAL NOT NULL,               -- sum of squared durations, s^2
    self_ns INTEGER NOT NULL,            -- sum of durations less their folded children's
    top_ns INTEGER NOT NULL,             -- sum of durations of the calls with no folded parent
    top_first_ns INTEGER NOT NULL,       -- earliest start of those
    top_last_ns INTEGER NOT NULL,        -- latest end of those
    PRIMARY KEY (run_id, rep, pid, tid, site_id, t0_ns)
) WITHOUT ROWID;
"""
TABLE = "call_buckets"
# Per-row figures, in the order of the table after its key
FIGURES = ("calls", "pieces", "raised", "time_ns", "time_sq", "self_ns", "top_ns",
           "top_first_ns", "top_last_ns")
KEY = ("rep", "pid", "tid", "site_id", "t0_ns", "width_ns")
BUSY = (-1, -1, -1)  # (pid, tid, site_id) of a repetition's rows of busy time: the union of its
# folded calls in the bucket (`top_ns`), for the program's time between calls
_ADD = ("calls", "pieces", "raised", "time_ns", "time_sq", "self_ns", "top_ns")


def has_table(db: sqlite3.Connection) -> bool:
    """Whether the store has the table (a store written before `--keep` has not)."""
    return db.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name=?",
                      (TABLE,)).fetchone() is not None


def foldable(db: sqlite3.Connection, run_id: int, rep: int, after_ns: int, before_ns: int,
             width_ns: int, limit: int) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """(chunk id, columns) of up to `limit` chunks of one repetition lying wholly in
    [after_ns, before_ns) and spanning less than `width_ns`: a chunk holding a call as long as
    a bucket stays in detail (one chunk per such call: an epoch, a `fit`)."""
    return events.chunks(
        db, "run_id=? AND rep=? AND t_first_ns>=? AND t_last_ns<? AND t_last_ns-t_first_ns<?",
        (run_id, rep, after_ns, before_ns, width_ns), order=f"t_first_ns, id LIMIT {int(limit)}")


def span(db: sqlite3.Connection, run_id: int) -> dict[int, tuple[int, int]]:
    """{rep: (earliest start, latest end)} of the chunks kept in detail."""
    return {int(r): (int(a), int(b)) for r, a, b in db.execute(
        "SELECT rep, min(t_first_ns), max(t_last_ns) FROM event_chunks WHERE run_id=? "
        "GROUP BY rep", (run_id,))}


def replace(db: sqlite3.Connection, run_id: int, chunk_ids: list[int],
            rows: list[tuple[Any, ...]]) -> bool:
    """Inside the caller's transaction: delete the folded chunks and add their bucket rows
    (KEY + FIGURES), summed into rows already there. Raises `_Raced` when a chunk is gone
    (folded by another writer meanwhile): the caller rolls back."""
    marks = ",".join("?" * len(chunk_ids))
    gone = db.execute(f"DELETE FROM event_chunks WHERE run_id=? AND id IN ({marks})",
                      (run_id, *chunk_ids)).rowcount
    if gone != len(chunk_ids):
        raise _Raced
    names = ("run_id", *KEY, *FIGURES)
    added = ", ".join(f"{c}={c}+excluded.{c}" for c in _ADD)
    db.executemany(
        f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({','.join('?' * len(names))}) "
        f"ON CONFLICT (run_id, rep, pid, tid, site_id, t0_ns) DO UPDATE SET {added}, "
        "top_first_ns=min(top_first_ns, excluded.top_first_ns), "
        "top_last_ns=max(top_last_ns, excluded.top_last_ns)",
        [(run_id, *r) for r in rows])
    return True


class _Raced(Exception):
    """A chunk to fold was folded by another writer: the transaction is rolled back."""


def columns(db: sqlite3.Connection, run_id: int) -> dict[str, np.ndarray] | None:
    """The run's bucket rows as numpy columns (KEY + FIGURES), None when it has none."""
    import numpy as np

    if not has_table(db):
        return None
    names = (*KEY, *FIGURES)
    got = db.execute(f"SELECT {', '.join(names)} FROM {TABLE} WHERE run_id=? "
                     "ORDER BY rep, t0_ns, pid, tid, site_id", (run_id,)).fetchall()
    if not got:
        return None
    table = list(zip(*got, strict=True))
    return {c: np.array(v, float if c == "time_sq" else np.int64)
            for c, v in zip(names, table, strict=True)}


def folded_calls(db: sqlite3.Connection, run_id: int) -> int:
    """How many calls of the run are held in buckets."""
    if not has_table(db):
        return 0
    return int(db.execute(f"SELECT coalesce(sum(calls), 0) FROM {TABLE} WHERE run_id=?",
                          (run_id,)).fetchone()[0])


def by_site_and_process(db: sqlite3.Connection, run_id: int) -> list[tuple[int, int, int, int]]:
    """(site_id, pid, calls, total ns) of the run's folded calls."""
    if not has_table(db):
        return []
    return [tuple(int(v) for v in r) for r in db.execute(
        f"SELECT site_id, pid, sum(calls), sum(time_ns) FROM {TABLE} WHERE run_id=? "
        "AND site_id>=0 GROUP BY site_id, pid", (run_id,))]


class BucketStore:
    """Mixed into `Store`: the folded calls' reads and the fold's write."""

    db: sqlite3.Connection

    def transaction(self) -> Any: ...  # `Store.transaction`

    def call_buckets(self, run_id: int) -> dict[str, np.ndarray] | None:
        return columns(self.db, run_id)

    def folded_calls(self, run_id: int) -> int:
        return folded_calls(self.db, run_id)

    def folded_by_site_and_process(self, run_id: int) -> list[tuple[int, int, int, int]]:
        return by_site_and_process(self.db, run_id)

    def detail_span(self, run_id: int) -> dict[int, tuple[int, int]]:
        return span(self.db, run_id)

    def foldable_chunks(self, run_id: int, rep: int, after_ns: int, before_ns: int,
                        width_ns: int, limit: int) -> list[tuple[int, dict[str, np.ndarray]]]:
        return list(foldable(self.db, run_id, rep, after_ns, before_ns, width_ns, limit))

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """Every read inside sees the store as of one moment (a read transaction): a run still
        recording is folded and added to meanwhile, and a report reads chunks and buckets
        more than once."""
        if self.db.in_transaction:
            yield
            return
        self.db.execute("BEGIN")
        try:
            yield
        finally:
            self.db.execute("COMMIT")

    def fold(self, run_id: int, chunk_ids: list[int], rows: list[tuple[Any, ...]]) -> bool:
        """Replace chunks by their bucket rows (`replace`) in one transaction; False when
        another writer folded one of them first (nothing is written then)."""
        try:
            with self.transaction():
                return replace(self.db, run_id, chunk_ids, rows)
        except _Raced:
            return False
